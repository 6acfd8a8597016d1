from __future__ import annotations

import time
from contextlib import contextmanager


class StageTimer:
    """Wall time per named stage, reported as `timing_s/<stage>`."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    def total(self) -> float:
        return sum(self.seconds.values())

    def metrics(self) -> dict[str, float]:
        return {**{f"timing_s/{k}": v for k, v in self.seconds.items()}, "timing_s/step": self.total()}
