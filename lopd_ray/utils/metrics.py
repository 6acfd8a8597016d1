"""Metrics to `metrics.jsonl` (one JSON object per step) and the sinks of `run.loggers`."""
from __future__ import annotations

import json
import os

from lopd_ray.utils.atomic import write_file
from lopd_ray.utils.metric_sinks import METRIC_SINKS


class MetricsLogger:
    def __init__(self, run_dir: str, loggers: tuple[str, ...] | list[str] = (), resume_step: int = 0,
                 config: dict | None = None):
        """`config`: the run's settings, flat (key -> value), for the sinks that record them."""
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._drop_steps_from(resume_step)
        self.file = open(self.path, "a")
        self.sinks = [METRIC_SINKS[name](run_dir, os.path.basename(run_dir), config or {}) for name in loggers]

    def _drop_steps_from(self, step: int) -> None:
        drop_rows_from(self.path, "step", step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        self.file.close()
        for sink in self.sinks:
            sink.close()


def drop_rows_from(path: str, key: str, value: float) -> None:
    """A resumed run rewrites the rows after its checkpoint; keep the file free of duplicates."""
    if os.path.exists(path):
        write_file(path, "".join(json.dumps(row) + "\n" for row in read_rows(path) if row[key] < value))


def append_row(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def select_metrics(rows: list[dict], requested: tuple[str, ...]) -> list[str]:
    """The logged metrics among `requested`, in order; a name ending in "/" takes every metric under that prefix,
    and "" every metric."""
    present = sorted({k for r in rows for k in r if k != "step"})
    return [n for m in requested for n in ([p for p in present if p.startswith(m)] if m.endswith("/") or not m
                                           else [m]) if n in present]


def read_metrics(run_dir: str) -> list[dict]:
    return read_rows(os.path.join(run_dir, "metrics.jsonl"))


def read_rows(path: str) -> list[dict]:
    """The rows of a JSON-lines file; a last line cut short by a killed run is skipped."""
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    rows = [json.loads(line) for line in lines[:-1]]
    try:
        rows += [json.loads(lines[-1])] if lines else []
    except json.JSONDecodeError:
        pass
    return rows
