"""The fallback engine: HF transformers, every request of a call in one batch over a KV cache, each sampled with its
own seeded generator."""
from __future__ import annotations

import torch

from lopd_ray.learner.weight_channel import Channel, join, receive
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

    @staticmethod
    def _sample(logits: torch.Tensor, spec: SamplingSpec, generator: torch.Generator) -> tuple[int, float]:
        """A token from one row of logits ([V]) and its log-prob under the distribution it was drawn from."""
        if spec.temperature == 0:  # greedy, as vLLM treats temperature 0
            logprobs = torch.log_softmax(logits, -1)
            token = int(torch.argmax(logprobs))
        else:
            logprobs = torch.log_softmax(filter_logits(logits / spec.temperature, spec.top_k, spec.top_p), -1)
            # Inverse CDF of one seeded uniform draw (a few times cheaper than torch.multinomial on one row); the
            # first token whose cumulative mass exceeds it has mass of its own, so a filtered token is never drawn.
            cdf = logprobs.exp().cumsum(0)
            draw = torch.rand((), generator=generator, device=logits.device) * cdf[-1]
            token = min(int(torch.searchsorted(cdf, draw, right=True)), len(cdf) - 1)
        return token, float(logprobs[token])

    @torch.no_grad()
    def generate(self, prompts, specs):
        """Every prompt in one left-padded batch over a KV cache; each row samples with a generator seeded by its
        own spec, so a prompt draws the same tokens in any batch (up to float noise in the logits)."""
        if not prompts:
            return []
        width = max(map(len, prompts))
        ids = torch.zeros((len(prompts), width), dtype=torch.long, device=self.device)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt, device=self.device)
            mask[row, width - len(prompt):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generators = [torch.Generator(device=self.device).manual_seed(s.seed) for s in specs]
        out = [Generation([], [], "length") for _ in prompts]
        live = list(range(len(prompts)))
        step = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        while live:
            logits = step.logits[:, -1].float()
            tokens = torch.zeros((len(prompts), 1), dtype=torch.long, device=self.device)
            for row in live:
                token, logprob = self._sample(logits[row], specs[row], generators[row])
                out[row].token_ids.append(token)
                out[row].logprobs.append(logprob)
                tokens[row] = token
                if token in self.stop_token_ids:
                    out[row].finish_reason = "stop"
            live = [r for r in live if out[r].finish_reason == "length"
                    and len(out[r].token_ids) < specs[r].max_new_tokens]
            if live:  # finished rows ride along (their outputs are ignored) so that the cache keeps its shape
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
                positions = positions[:, -1:] + 1
                step = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions,
                                  past_key_values=step.past_key_values, use_cache=True)
        return out

    def load_weights(self, payload: bytes) -> None:
        from safetensors.torch import load

        self._copy_in(load(payload).items())

    def open_weight_channel(self, channel: dict, first_rank: int) -> None:
        self.channel, self.channel_device = join(channel, first_rank), Channel(**channel).device

    def receive_weights(self, buckets: list) -> None:
        self._copy_in(receive(self.channel, buckets, self.channel_device))

    @torch.no_grad()
    def _copy_in(self, named) -> None:
        params = dict(self.model.named_parameters())
        for name, tensor in named:
            if name in params:  # a tied lm_head shares the embedding's storage
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
