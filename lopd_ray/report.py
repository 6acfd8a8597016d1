"""`python -m lopd_ray.report RUN_DIR [METRIC ...]`: the curves of a run, printed as text from metrics.jsonl."""
from __future__ import annotations

import sys

from lopd_ray.utils.metrics import read_metrics

DEFAULT_METRICS = ("rollout/reward_mean", "sync/logprob_diff_max", "timing_s/step")
BAR_WIDTH = 40


def curve(values: list[float]) -> list[str]:
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return ["#" * (1 + round((v - low) / span * (BAR_WIDTH - 1))) for v in values]


def report(run_dir: str, metrics: tuple[str, ...] = DEFAULT_METRICS) -> str:
    rows = read_metrics(run_dir)
    lines = []
    for name in metrics:
        values = [r[name] for r in rows if name in r]
        if not values:
            continue
        lines.append(f"{name}  (first {values[0]:.4g}, last {values[-1]:.4g}, min {min(values):.4g}, "
                     f"max {max(values):.4g})")
        for row, bar in zip((r for r in rows if name in r), curve(values)):
            lines.append(f"  step {row['step']:>4}  {row[name]:>10.4g}  {bar}")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m lopd_ray.report RUN_DIR [METRIC ...]")
    print(report(sys.argv[1], tuple(sys.argv[2:]) or DEFAULT_METRICS))


if __name__ == "__main__":
    main()
