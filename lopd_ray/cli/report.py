"""`python -m lopd_ray.report RUN_DIR [RUN_DIR ...] [METRIC ...] [--table METRIC ...] [--png [DIR]] [--html [FILE]]`:
a run's curves, printed as text from metrics.jsonl; `--table` adds one line per metric (a name ending in "/" takes
every metric under that prefix) with its first value, the means of its first and last 5 steps, and its last value.
`--png` writes the curves (reward, KL, margin, timing) as PNG files, `--html` also a one-page HTML report with the
table and decoded rollouts coloured by the teacher-student gap beside the teacher's context. Several runs go on the
same axes and the same page, the table with a column per run (the mean of its last 5 steps)."""
from __future__ import annotations

import argparse
import difflib
import os
import sys
from typing import Optional

from lopd_ray.errors import ConfigError
from lopd_ray.startup import command
from lopd_ray.reporting.figures import run_name
from lopd_ray.reporting.summary import SUMMARY_COLUMNS, last_means, summary_rows
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


def table(run_dirs: list[str], metrics: tuple[str, ...]) -> str:
    """One run: each metric's first and last values and window means; several: a column per run (the mean of its
    last steps)."""
    if len(run_dirs) == 1:
        header, rows = SUMMARY_COLUMNS, [tuple(row) for row in summary_rows(run_dirs[0], metrics)]
    else:
        means = [last_means(d, metrics) for d in run_dirs]
        header = ("metric", *map(run_name, run_dirs))
        rows = [(n, *(m.get(n, float("nan")) for m in means)) for n in dict.fromkeys(n for m in means for n in m)]
    width = max([len(header[0])] + [len(row[0]) for row in rows])
    columns = max([10] + [len(c) for c in header[1:]])
    lines = [f"{header[0]:<{width}}  " + "  ".join(f"{c:>{columns}}" for c in header[1:])]
    lines += [f"{name:<{width}}  " + "  ".join(f"{v:>{columns}.4g}" for v in values) for name, *values in rows]
    return "\n".join(lines)


def runs_and_metrics(words: list[str]) -> tuple[list[str], list[str]]:
    """The leading words that are folders are the runs (at least the first word), the rest metric names."""
    count = next((i for i, word in enumerate(words) if not os.path.isdir(word)), len(words))
    return words[:max(count, 1)], words[max(count, 1):]


def check_request(run_dirs: list[str], metrics: tuple[str, ...]) -> None:
    """A run without metrics.jsonl, or a metric (or "prefix/") no run logged, is an error naming the fix."""
    for run_dir in run_dirs:
        if not os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
            raise ConfigError(f"no metrics.jsonl under '{run_dir}': give a run directory such as "
                              f"runs/lopd_letters_cpu (runs are written under run.output_dir/run.name)")
    present = sorted({k for run_dir in run_dirs for r in read_metrics(run_dir) for k in r if k != "step"})
    for name in metrics:
        if not any(p.startswith(name) if name.endswith("/") else p == name for p in present):
            close = difflib.get_close_matches(name, present, n=3) or present[:5]
            where = f"{run_dirs[0]}/metrics.jsonl" if len(run_dirs) == 1 else "the runs' metrics.jsonl"
            raise ConfigError(f"metric '{name}' is not in {where}: did you mean "
                              f"{', '.join(close)}? (a name ending in '/' takes every metric under that prefix)")


def pictures(run_dirs: list[str], png_dir: Optional[str], html_path: Optional[str]) -> int:
    from lopd_ray.reporting.figures import write_pngs
    from lopd_ray.reporting.page import write_html

    pngs = write_pngs(run_dirs, png_dir or os.path.join(run_dirs[0], "report"))
    print(f"Wrote {len(pngs)} PNG files into {os.path.dirname(pngs[0])}: "
          f"{', '.join(os.path.basename(p) for p in pngs)}.", flush=True)
    if html_path is not None:
        page = write_html(run_dirs, html_path or os.path.join(run_dirs[0], "report", "index.html"), pngs[0])
        print(f"Wrote the page {page}.", flush=True)
    return 0


def show(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m lopd_ray.report", description=__doc__)
    parser.add_argument("runs_and_metrics", nargs="+", metavar="RUN_DIR [RUN_DIR ...] [METRIC ...]",
                        help=f"run folders, then curves to print (default: {' '.join(DEFAULT_METRICS)})")
    parser.add_argument("--table", nargs="+", default=[], metavar="METRIC")
    parser.add_argument("--png", nargs="?", const="", metavar="DIR",
                        help="write the curves as PNG files into DIR (default: RUN_DIR/report)")
    parser.add_argument("--html", nargs="?", const="", metavar="FILE",
                        help="write a one-page HTML report to FILE (default: RUN_DIR/report/index.html)")
    args = parser.parse_args(argv)
    run_dirs, metrics = runs_and_metrics(args.runs_and_metrics)
    check_request(run_dirs, (*metrics, *args.table))
    if args.png is not None or args.html is not None:
        return pictures(run_dirs, args.png, args.html)
    if metrics or not args.table:
        for run_dir in run_dirs:
            print(*([f"== {run_dir}"] if len(run_dirs) > 1 else []), report(run_dir, tuple(metrics) or DEFAULT_METRICS),
                  sep="\n")
    if args.table:
        print(table(run_dirs, tuple(args.table)))
    return 0


main = command(show)

if __name__ == "__main__":
    sys.exit(main())
