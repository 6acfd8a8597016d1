"""The vLLM engine (GPU build, or the CPU build where there is no GPU). Every vLLM-specific call lives here."""
from __future__ import annotations

import itertools
import json
import os

from lopd_ray.rollout.engines.base import Generation, InferenceEngine


class WeightReceiver:
    """Mixed into vLLM's worker (`worker_extension_cls`); runs inside the engine process. Named apart from vLLM's
    own `update_weights`."""

    def lopd_load_safetensors(self, payload: bytes) -> int:
        from safetensors.torch import load

        tensors = load(payload)
        self.reload_weights(weights_iterator=iter(tensors.items()))
        return len(tensors)

    def lopd_open_channel(self, channel: dict, first_rank: int) -> None:
        from lopd_ray.modeling.weight_channel import Channel, join

        self.lopd_channel = join(channel, first_rank + self.rank)  # one rank per tensor-parallel shard
        self.lopd_channel_device = Channel(**channel).device

    def lopd_receive(self, buckets: list) -> None:
        from lopd_ray.modeling.weight_channel import receive

        self.reload_weights(weights_iterator=receive(self.lopd_channel, buckets, self.lopd_channel_device))


def check_head_size(model_path: str) -> None:
    """vLLM's CPU attention runs only some head sizes; a model with another would fail at its first generation."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    with open(os.path.join(model_path, "config.json")) as f:
        config = json.load(f)
    head_size = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if not CPUAttentionBackend.supports_head_size(head_size):
        raise ValueError(f"{model_path} has attention heads of size {head_size}, which vLLM's CPU attention does not "
                         f"run (it runs {CPUAttentionBackend.get_supported_head_sizes()}): set rollout.engine=hf, or "
                         f"use a model whose head_dim is one of those")


class VLLMEngine(InferenceEngine):
    def __init__(self, model_path, rollout_cfg, dtype, stop_token_ids):
        super().__init__(model_path, rollout_cfg, dtype, stop_token_ids)
        import torch
        from vllm import LLM

        check_head_size(model_path)
        # A prompt prefilled in chunks makes vLLM rewind its per-request (seeded) sampler, which CPU generators
        # cannot do ("CPU Generator does not use offset"): on CPU, every prompt is prefilled in one piece.
        self.llm = LLM(model=model_path, dtype=dtype, max_model_len=rollout_cfg.max_model_len,
                       gpu_memory_utilization=rollout_cfg.gpu_memory_utilization, enforce_eager=True,
                       logprobs_mode="processed_logprobs", enable_prefix_caching=False,
                       enable_chunked_prefill=torch.cuda.is_available(),
                       worker_extension_cls=f"{__name__}.WeightReceiver", seed=0, use_tqdm_on_load=False,
                       # shards in processes of this actor, on the GPUs of its bundle (not a placement group of vLLM's)
                       tensor_parallel_size=rollout_cfg.tensor_parallel_size,
                       distributed_executor_backend="mp" if rollout_cfg.tensor_parallel_size > 1 else None)
        self.request_ids, self.in_flight = itertools.count(), {}  # submitted requests: vLLM id -> caller's key

    def _params(self, spec):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        # FINAL_ONLY: a request's output is built once, when it ends, instead of after every engine step.
        return SamplingParams(temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k,
                              max_tokens=spec.max_new_tokens, seed=spec.seed, logprobs=0,
                              stop_token_ids=self.stop_token_ids, detokenize=False,
                              output_kind=RequestOutputKind.FINAL_ONLY)

    @staticmethod
    def _generation(output) -> Generation:
        comp = output.outputs[0]
        ids = list(comp.token_ids)
        lps = [float(step[tok].logprob) for tok, step in zip(ids, comp.logprobs)]
        return Generation(ids, lps, "stop" if comp.finish_reason == "stop" else "length")

    def generate(self, prompts, specs):
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], [self._params(s) for s in specs],
                                    use_tqdm=False)
        return [self._generation(out) for out in outputs]

    def submit(self, key, prompt, spec):
        request_id = f"turn-{next(self.request_ids)}"  # apart from LLM.generate's own numbers
        self.in_flight[request_id] = key
        self.llm.llm_engine.add_request(request_id, {"prompt_token_ids": prompt}, self._params(spec))

    def collect(self):
        """Engine steps until some requests finish (requests submitted meanwhile join the running batch). An error
        is the answer of every request in flight, which are dropped."""
        try:
            while True:
                if not self.llm.llm_engine.has_unfinished_requests():
                    raise RuntimeError(f"vLLM holds none of the {len(self.in_flight)} requests submitted to it")
                finished = [out for out in self.llm.llm_engine.step() if out.finished]
                if finished:
                    return [(self.in_flight.pop(out.request_id), self._generation(out)) for out in finished]
        except Exception as exc:  # noqa: BLE001 - the caller fails the episodes it belongs to
            self.llm.llm_engine.abort_request(list(self.in_flight))
            failed, self.in_flight = list(self.in_flight.values()), {}
            return [(key, exc) for key in failed]

    def load_weights(self, payload: bytes) -> None:
        self.llm.collective_rpc("lopd_load_safetensors", args=(payload,))
        self.llm.reset_prefix_cache()

    def open_weight_channel(self, channel: dict, first_rank: int) -> None:
        self.llm.collective_rpc("lopd_open_channel", args=(channel, first_rank))

    def receive_weights(self, buckets: list) -> None:
        self.llm.collective_rpc("lopd_receive", args=(buckets,))
        self.llm.reset_prefix_cache()

    def shutdown(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
