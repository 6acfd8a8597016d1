"""The InferenceEngine seam: token ids in, token ids and sampled-token log-probs out, weights replaceable."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

@dataclass
class SamplingSpec:
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    seed: int


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]      # log-prob of each sampled token under the sampling distribution
    finish_reason: str         # "stop" or "length"


class InferenceEngine(ABC):
    def __init__(self, model_path: str, rollout_cfg, dtype: str, stop_token_ids: list[int]):
        self.model_path, self.cfg, self.dtype, self.stop_token_ids = model_path, rollout_cfg, dtype, stop_token_ids

    @abstractmethod
    def generate(self, prompts: list[list[int]], specs: list[SamplingSpec]) -> list[Generation]: ...

    @abstractmethod
    def load_weights(self, payload: bytes) -> None:
        """Replace every weight in `payload` (safetensors bytes, HF names; `lm_head.weight` present even when tied)."""

    @abstractmethod
    def open_weight_channel(self, channel: dict, first_rank: int) -> None:
        """Join a broadcast channel (lopd_ray/learner/weight_channel.py); a sharded engine's processes join as
        first_rank, first_rank + 1, ..."""

    @abstractmethod
    def receive_weights(self, buckets: list) -> None:
        """Replace every weight with those broadcast on the open channel, as `load_weights` does."""

    def shutdown(self) -> None:
        pass
