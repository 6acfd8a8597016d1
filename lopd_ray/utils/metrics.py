"""Metrics to `metrics.jsonl` (one JSON object per step) and TensorBoard."""
from __future__ import annotations

import json
import os

from lopd_ray.utils.atomic import write_file


class MetricsLogger:
    def __init__(self, run_dir: str, tensorboard: bool, resume_step: int = 0):
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._drop_steps_from(resume_step)
        self.file = open(self.path, "a")
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(os.path.join(run_dir, "tensorboard"))

    def _drop_steps_from(self, step: int) -> None:
        drop_rows_from(self.path, "step", step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()


def drop_rows_from(path: str, key: str, value: float) -> None:
    """A resumed run rewrites the rows after its checkpoint; keep the file free of duplicates."""
    if os.path.exists(path):
        write_file(path, "".join(json.dumps(row) + "\n" for row in read_rows(path) if row[key] < value))


def append_row(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


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
