"""The vLLM engine (GPU build, or the CPU build where there is no GPU). Every vLLM-specific call lives here."""
from __future__ import annotations

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
        from lopd_ray.learner.weight_channel import Channel, join

        self.lopd_channel = join(channel, first_rank + self.rank)  # one rank per tensor-parallel shard
        self.lopd_channel_device = Channel(**channel).device

    def lopd_receive(self, buckets: list) -> None:
        from lopd_ray.learner.weight_channel import receive

        self.reload_weights(weights_iterator=receive(self.lopd_channel, buckets, self.lopd_channel_device))


class VLLMEngine(InferenceEngine):
    def __init__(self, model_path, rollout_cfg, dtype, stop_token_ids):
        super().__init__(model_path, rollout_cfg, dtype, stop_token_ids)
        import torch
        from vllm import LLM

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

    def generate(self, prompts, specs):
        from vllm import SamplingParams

        params = [SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_new_tokens,
                                 seed=s.seed, logprobs=0, stop_token_ids=self.stop_token_ids, detokenize=False)
                  for s in specs]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        results = []
        for out in outputs:
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            lps = [float(step[tok].logprob) for tok, step in zip(ids, comp.logprobs)]
            results.append(Generation(ids, lps, "stop" if comp.finish_reason == "stop" else "length"))
        return results

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
