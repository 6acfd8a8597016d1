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

    def shutdown(self) -> None:
        pass
