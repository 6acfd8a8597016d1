"""`python -m lopd_ray.study SPEC.yaml [--quick] [--scale NAME] [--out DIR]`

Runs the spec's grid (methods x seeds, then ablations) as ordinary training runs, each evaluating the student alone
on a held-out split, and writes <out>/<name>/results.json, results.md and the plots held_out_vs_episodes.png and
held_out_vs_train_seconds.png. Runs already finished are kept, so an interrupted study continues where it stopped.
--quick runs the spec's `quick` arms and seeds (into <name>_quick); --scale runs the spec's `scales` entry (into
<name>_<scale>). Exit 1 when a run failed (the others still run and are reported).
"""
from __future__ import annotations

import argparse
import os
import sys

from lopd_ray.startup import command
from lopd_ray.study.plots import write_plots
from lopd_ray.study.results import collect, write_results
from lopd_ray.study.runner import run_all
from lopd_ray.study.spec import check_runs, load_spec, plan_runs


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lopd_ray.study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="the study's YAML (e.g. recipes/studies/letters.yaml)")
    parser.add_argument("--quick", action="store_true", help="the spec's quick arms and seeds only")
    parser.add_argument("--scale", default="cpu", help="a key of the spec's `scales` (default: cpu, the recipes)")
    parser.add_argument("--out", default="study", help="where <name>/ is written (default: study)")
    return parser.parse_args(argv)


def study(argv: list[str]) -> int:
    args = parse_args(argv)
    spec = load_spec(args.spec)
    name = spec.name + ("_quick" if args.quick else "") + ("" if args.scale == "cpu" else f"_{args.scale}")
    out_dir = os.path.abspath(os.path.join(args.out, name))
    runs_dir = os.path.join(out_dir, "runs")
    runs = plan_runs(spec, runs_dir, args.quick, args.scale)
    budget, total_steps = check_runs(runs)
    print(f"study {name}: {len(runs)} runs, budget {budget}, into {out_dir}", flush=True)
    failed = run_all(runs, runs_dir, total_steps)
    results = collect(name, runs, runs_dir, budget, failed)
    write_results(out_dir, results)
    if results["arms"]:
        write_plots(out_dir, results)
    print(open(os.path.join(out_dir, "results.md")).read(), flush=True)
    return 1 if failed else 0


main = command(study)


if __name__ == "__main__":
    sys.exit(main())
