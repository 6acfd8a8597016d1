"""A run's metrics summed up per metric: first value, means of the first and last WINDOW steps, last value."""
from __future__ import annotations

from lopd_ray.utils.metrics import read_metrics, select_metrics

WINDOW = 5


def summary_rows(run_dir: str, metrics: tuple[str, ...]) -> list[tuple[str, float, float, float, float]]:
    """Per metric: its first value, the means of its first and last WINDOW steps, its last value."""
    rows = read_metrics(run_dir)
    summary = []
    for name in select_metrics(rows, metrics):
        values = [r[name] for r in rows if name in r]
        head, tail = values[:WINDOW], values[-WINDOW:]
        summary.append((name, values[0], sum(head) / len(head), sum(tail) / len(tail), values[-1]))
    return summary


def last_means(run_dir: str, metrics: tuple[str, ...] = ("",)) -> dict[str, float]:
    """Per metric: the mean of its last WINDOW steps."""
    return {name: tail for name, _, _, tail, _ in summary_rows(run_dir, metrics)}


SUMMARY_COLUMNS = ("metric", "first", f"first {WINDOW}", f"last {WINDOW}", "last")
