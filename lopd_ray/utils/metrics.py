"""Metrics to `metrics.jsonl` (one JSON object per step) and the sinks of `run.loggers`."""
from __future__ import annotations

import json
import os
import sys
from typing import Optional

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
        write_file(path, "".join(json.dumps(row) + "\n" for row in read_rows(path, key) if row[key] < value))


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
    return read_rows(os.path.join(run_dir, "metrics.jsonl"), "step")


def read_rows(path: str, key: Optional[str] = None) -> list[dict]:
    """The rows of a JSON-lines file (that hold `key`, if given). A last line cut short by a killed run (no newline)
    is skipped; any other line that is not such a JSON object is skipped with one warning on stderr naming it."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            row, why = None, f"not JSON ({exc})"
        else:
            why = "not a JSON object" + (f" with '{key}'" if key else "")
        if isinstance(row, dict) and (key is None or key in row):
            rows.append(row)
        elif number < len(lines) or line.endswith("\n"):
            _warn_once(f"warning: {path} line {number} is {why}: skipped")
    return rows


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """A command reads one file several times (a report's checks, text and table): each bad line is said once."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(message, file=sys.stderr, flush=True)
