"""`python -m lopd_ray.report RUN_DIR [METRIC ...] [--table METRIC ...] [--png [DIR]] [--html [FILE]]`: a run's
curves, printed as text from metrics.jsonl; `--table` adds one line per metric (a name ending in "/" takes every
metric under that prefix) with its first value, the means of its first and last 5 steps, and its last value.
`--png` writes the curves (reward, KL, margin, timing) as PNG files, `--html` also a one-page HTML report with the
table and decoded rollouts colored by the teacher-student gap."""
from __future__ import annotations

import argparse
import difflib
import os
import sys
from typing import Optional

from lopd_ray.errors import ConfigError
from lopd_ray.startup import command
from lopd_ray.reporting.summary import SUMMARY_COLUMNS, summary_rows
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


def table(run_dir: str, metrics: tuple[str, ...]) -> str:
    summary = summary_rows(run_dir, metrics)
    width = max((len(row[0]) for row in summary), default=0)
    lines = [f"{SUMMARY_COLUMNS[0]:<{width}}  " + "  ".join(f"{c:>10}" for c in SUMMARY_COLUMNS[1:])]
    lines += [f"{name:<{width}}  " + "  ".join(f"{v:>10.4g}" for v in values) for name, *values in summary]
    return "\n".join(lines)


def check_request(run_dir: str, metrics: tuple[str, ...]) -> None:
    """A run without metrics.jsonl, or a metric (or "prefix/") the run never logged, is an error naming the fix."""
    if not os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
        raise ConfigError(f"no metrics.jsonl under '{run_dir}': give a run directory such as runs/lopd_letters_cpu "
                          f"(runs are written under run.output_dir/run.name)")
    present = sorted({k for r in read_metrics(run_dir) for k in r if k != "step"})
    for name in metrics:
        if not any(p.startswith(name) if name.endswith("/") else p == name for p in present):
            close = difflib.get_close_matches(name, present, n=3) or present[:5]
            raise ConfigError(f"metric '{name}' is not in {run_dir}/metrics.jsonl: did you mean "
                              f"{', '.join(close)}? (a name ending in '/' takes every metric under that prefix)")


def pictures(run_dir: str, png_dir: Optional[str], html_path: Optional[str]) -> int:
    from lopd_ray.reporting.figures import write_pngs
    from lopd_ray.reporting.page import write_html

    pngs = write_pngs(run_dir, png_dir or os.path.join(run_dir, "report"))
    print(f"Wrote {len(pngs)} PNG files into {os.path.dirname(pngs[0])}: "
          f"{', '.join(os.path.basename(p) for p in pngs)}.", flush=True)
    if html_path is not None:
        page = write_html(run_dir, html_path or os.path.join(run_dir, "report", "index.html"), pngs[0])
        print(f"Wrote the page {page}.", flush=True)
    return 0


def show(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m lopd_ray.report", description=__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("metrics", nargs="*", help=f"curves to print (default: {' '.join(DEFAULT_METRICS)})")
    parser.add_argument("--table", nargs="+", default=[], metavar="METRIC")
    parser.add_argument("--png", nargs="?", const="", metavar="DIR",
                        help="write the curves as PNG files into DIR (default: RUN_DIR/report)")
    parser.add_argument("--html", nargs="?", const="", metavar="FILE",
                        help="write a one-page HTML report to FILE (default: RUN_DIR/report/index.html)")
    args = parser.parse_args(argv)
    check_request(args.run_dir, (*args.metrics, *args.table))
    if args.png is not None or args.html is not None:
        return pictures(args.run_dir, args.png, args.html)
    if args.metrics or not args.table:
        print(report(args.run_dir, tuple(args.metrics) or DEFAULT_METRICS))
    if args.table:
        print(table(args.run_dir, tuple(args.table)))
    return 0


main = command(show)

if __name__ == "__main__":
    sys.exit(main())
