"""The InferenceEngine seam: token ids in, token ids and sampled-token log-probs out, weights replaceable."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Hashable, Union

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
        self.queued: list[tuple[Hashable, list[int], SamplingSpec]] = []

    @abstractmethod
    def generate(self, prompts: list[list[int]], specs: list[SamplingSpec]) -> list[Generation]: ...

    # Requests one at a time (rollout.turns=continuous): an engine that batches at the token level takes a request
    # while others are generating; this default generates what is queued in one batch when asked.
    def submit(self, key: Hashable, prompt: list[int], spec: SamplingSpec) -> None:
        self.queued.append((key, prompt, spec))

    def collect(self) -> list[tuple[Hashable, Union[Generation, Exception]]]:
        """Some submitted requests that have finished (at least one while any is pending), with their keys; a
        request the engine failed on comes back as the exception."""
        queued, self.queued = self.queued, []
        results = generate_isolated(self, [prompt for _, prompt, _ in queued], [spec for _, _, spec in queued])
        return [(key, result) for (key, _, _), result in zip(queued, results)]

    @abstractmethod
    def load_weights(self, payload: bytes) -> None:
        """Replace every weight in `payload` (safetensors bytes, HF names; `lm_head.weight` present even when tied)."""

    @abstractmethod
    def open_weight_channel(self, channel: dict, first_rank: int) -> None:
        """Join a broadcast channel (lopd_ray/modeling/weight_channel.py); a sharded engine's processes join as
        first_rank, first_rank + 1, ..."""

    @abstractmethod
    def receive_weights(self, buckets: list) -> None:
        """Replace every weight with those broadcast on the open channel, as `load_weights` does."""

    def shutdown(self) -> None:
        pass


def generate_isolated(engine: InferenceEngine, prompts: list[list[int]],
                      specs: list[SamplingSpec]) -> list[Union[Generation, Exception]]:
    """`engine.generate` in one batch; when that fails, one prompt at a time, so that a failure is the answer of
    the prompts it belongs to only."""
    try:
        return engine.generate(prompts, specs)
    except Exception:  # noqa: BLE001 - isolated below
        results: list[Union[Generation, Exception]] = []
        for prompt, spec in zip(prompts, specs):
            try:
                results += engine.generate([prompt], [spec])
            except Exception as exc:  # noqa: BLE001
                results.append(exc)
        return results
