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

    def metrics(self) -> dict[str, float]:
        out = {f"timing_s/{k}": v for k, v in self.seconds.items()}
        out["timing_s/step"] = sum(self.seconds.values())
        return out
