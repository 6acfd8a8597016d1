from __future__ import annotations

import time
from contextlib import contextmanager

from lopd_ray.utils.watchdog import mark_progress


class StageTimer:
    """Wall time per named stage, reported as `timing_s/<stage>`; a stage's start and end are progress for the step
    watchdog."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        mark_progress(stage)
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
            mark_progress()

    def total(self) -> float:
        return sum(self.seconds.values())

    def metrics(self) -> dict[str, float]:
        return {**{f"timing_s/{k}": v for k, v in self.seconds.items()}, "timing_s/step": self.total()}
