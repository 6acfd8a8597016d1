"""The fallback engine: HF transformers, every request of a call in one batch over a KV cache, each sampled with its
own seeded generator."""
from __future__ import annotations

import torch

from lopd_ray.modeling.weight_channel import Channel, join, receive
from lopd_ray.rollout.engines.base import Generation, InferenceEngine, SamplingSpec


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then nucleus filtering along the last dimension ([V] or [B, V]); removed entries become -inf."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, -1)
        drop = probs.cumsum(-1) - probs >= top_p  # mass before the token already covers top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return logits


class HFEngine(InferenceEngine):
    def __init__(self, model_path, rollout_cfg, dtype, stop_token_ids):
        super().__init__(model_path, rollout_cfg, dtype, stop_token_ids)
        from transformers import AutoModelForCausalLM

        self.device = "cuda" if torch.cuda.is_available() and rollout_cfg.gpus_per_worker > 0 else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(self.device)
        self.model.eval()

    @staticmethod
    def _sample(logits: torch.Tensor, spec: SamplingSpec, generators: list) -> tuple[list[int], list[float]]:
        """A token from each row of logits ([B, V], rows that share `spec`'s settings) and its log-prob under the
        distribution it was drawn from; row i draws with generators[i]."""
        if spec.temperature == 0:  # greedy, as vLLM treats temperature 0
            logprobs = torch.log_softmax(logits, -1)
            tokens = logprobs.argmax(-1)
        else:
            logprobs = torch.log_softmax(filter_logits(logits / spec.temperature, spec.top_k, spec.top_p), -1)
            # Inverse CDF of one seeded uniform draw per row (cheaper than torch.multinomial); the first token
            # whose cumulative mass exceeds it has mass of its own, so a filtered token is never drawn.
            cdf = logprobs.exp().cumsum(-1)
            draws = torch.stack([torch.rand((), generator=g, device=logits.device) for g in generators])
            tokens = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None], right=True)[:, 0]
            tokens = tokens.clamp(max=cdf.shape[-1] - 1)
        return tokens.tolist(), logprobs.gather(-1, tokens[:, None])[:, 0].tolist()

    @torch.no_grad()
    def generate(self, prompts, specs):
        """Every prompt in one left-padded batch over a KV cache; each row samples with a generator seeded by its
        own spec, so a prompt draws the same tokens in any batch (up to float noise in the logits)."""
        if not prompts:
            return []
        width, longest = max(map(len, prompts)), max(s.max_new_tokens for s in specs)
        ids = torch.zeros((len(prompts), width), dtype=torch.long, device=self.device)
        # The whole run's mask at once; step k reads its first width + k columns.
        full_mask = torch.ones((len(prompts), width + longest), dtype=torch.long, device=self.device)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt, device=self.device)
            full_mask[row, :width - len(prompt)] = 0
        mask = full_mask[:, :width]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generators = [torch.Generator(device=self.device).manual_seed(s.seed) for s in specs]
        out = [Generation([], [], "length") for _ in prompts]
        live = list(range(len(prompts)))
        step = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        while live:
            logits = step.logits[:, -1].float()
            tokens = torch.zeros((len(prompts), 1), dtype=torch.long, device=self.device)
            alike: dict[tuple, list[int]] = {}  # rows with the same sampling settings sample together
            for row in live:
                alike.setdefault((specs[row].temperature, specs[row].top_k, specs[row].top_p), []).append(row)
            for rows in alike.values():
                sampled, logprobs = self._sample(logits[rows], specs[rows[0]], [generators[r] for r in rows])
                tokens[rows, 0] = torch.tensor(sampled, device=self.device)
                for row, token, logprob in zip(rows, sampled, logprobs):
                    out[row].token_ids.append(token)
                    out[row].logprobs.append(logprob)
                    if token in self.stop_token_ids:
                        out[row].finish_reason = "stop"
            live = [r for r in live if out[r].finish_reason == "length"
                    and len(out[r].token_ids) < specs[r].max_new_tokens]
            if live:  # finished rows ride along (their outputs are ignored) so that the cache keeps its shape
                mask = full_mask[:, :mask.shape[1] + 1]
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
