"""The fallback engine: HF transformers with a seeded sampling loop (one request at a time, KV cache)."""
from __future__ import annotations

import torch

from lopd_ray.rollout.engines.base import Generation, InferenceEngine, SamplingSpec


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then nucleus filtering of a [V] row; removed entries become -inf."""
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop = cum - torch.softmax(sorted_logits, -1) >= top_p  # mass before the token already covers top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


class HFEngine(InferenceEngine):
    def __init__(self, model_path, rollout_cfg, dtype, stop_token_ids):
        super().__init__(model_path, rollout_cfg, dtype, stop_token_ids)
        from transformers import AutoModelForCausalLM

        self.device = "cuda" if torch.cuda.is_available() and rollout_cfg.gpus_per_worker > 0 else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(self.device)
        self.model.eval()

    @torch.no_grad()
    def _generate_one(self, prompt: list[int], spec: SamplingSpec) -> Generation:
        gen = torch.Generator(device=self.device).manual_seed(spec.seed)
        ids = torch.tensor([prompt], device=self.device)
        past, out_ids, out_lp, finish = None, [], [], "length"
        for _ in range(spec.max_new_tokens):
            out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            if spec.temperature == 0:  # greedy, as vLLM treats temperature 0
                logprobs = torch.log_softmax(out.logits[0, -1].float(), -1)
                token = int(torch.argmax(logprobs))
            else:
                logits = filter_logits(out.logits[0, -1].float() / spec.temperature, spec.top_k, spec.top_p)
                logprobs = torch.log_softmax(logits, -1)
                token = int(torch.multinomial(logprobs.exp(), 1, generator=gen))
            out_ids.append(token)
            out_lp.append(float(logprobs[token]))
            if token in self.stop_token_ids:
                finish = "stop"
                break
            ids = torch.tensor([[token]], device=self.device)
        return Generation(out_ids, out_lp, finish)

    def generate(self, prompts, specs):
        return [self._generate_one(p, s) for p, s in zip(prompts, specs)]

    @torch.no_grad()
    def load_weights(self, payload: bytes) -> None:
        from safetensors.torch import load

        params = dict(self.model.named_parameters())
        for name, tensor in load(payload).items():
            if name in params:  # a tied lm_head shares the embedding's storage
                params[name].copy_(tensor.to(params[name].dtype))
