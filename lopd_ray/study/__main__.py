"""`python -m lopd_ray.study SPEC.yaml [--gate] [--quick] [--scale NAME] [--out DIR] [--address URL] [--parallel N]
[--collect | --redraw]`

First the gate (lopd_ray/study/gate.py): the base model, before any training, scored on the held-out split alone
and as the teacher under each context; it writes <out>/<name>/gate.json and gate.md, and the grid runs only if it
passed (a gate measured before is kept; --gate measures it anew and stops there). Then the spec's grid (methods x
seeds, ablations, controls) as ordinary training runs, each evaluating the student alone on a held-out split, into
<out>/<name>/results.json, results.md and the plots held_out_vs_episodes.png and held_out_vs_train_seconds.png.
Runs already finished are kept, so an interrupted study continues where it stopped. --quick runs the spec's `quick`
arms and seeds (into <name>_quick); --scale runs the spec's `scales` entry (into <name>_<scale>); --collect runs
nothing and writes the results of the runs that finished (arms run one at a time, say); --redraw runs nothing and
draws the plots and results.md again from results.json (`--out study`: the committed figures). The runs run here
one after another (--parallel N: N at once), or with --address as Ray jobs of that cluster's job API, as many at
once as its CPUs and GPUs hold (and --parallel allows); --out must then be a folder the cluster's head node writes
to (this machine's, or storage it mounts). Exit 1 when a run failed (the others still run and are reported), 2 when
the gate refused the grid.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from lopd_ray.errors import ConfigError
from lopd_ray.startup import command
from lopd_ray.study.gate import markdown, run_gate
from lopd_ray.study.plots import write_plots
from lopd_ray.study.results import collect, write_results
from lopd_ray.study.runner import is_finished, run_all
from lopd_ray.study.spec import check_runs, load_spec, plan_runs


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lopd_ray.study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="the study's YAML (e.g. recipes/studies/rules.yaml)")
    parser.add_argument("--gate", action="store_true", help="measure the gate anew, print it and stop")
    parser.add_argument("--quick", action="store_true", help="the spec's quick arms and seeds only")
    parser.add_argument("--scale", default="cpu", help="a key of the spec's `scales` (default: cpu, the recipes)")
    parser.add_argument("--arms", default="", help="only these arms of the grid, comma-separated (e.g. "
                        "lopd,lopd_m0.2); results.md then holds them alone")
    parser.add_argument("--seeds", default="", help="only these seeds of those arms, comma-separated (e.g. 1)")
    parser.add_argument("--collect", action="store_true", help="run nothing: write the results of the chosen runs "
                        "that finished before (e.g. arms run one at a time), the others left out")
    parser.add_argument("--address", default="", help="a Ray cluster's job API (http://HOST:DASHBOARD_PORT): the "
                        "runs go to it as jobs, uploading the folder the study runs in")
    parser.add_argument("--parallel", type=int, default=0, help="at most N runs at once (default: 1 here, as many "
                        "as the cluster holds with --address)")
    parser.add_argument("--out", default=os.path.join("runs", "study"),
                        help="where <name>/ is written (default: runs/study; the committed results are under study/)")
    parser.add_argument("--redraw", action="store_true", help="run nothing: draw the plots and results.md again from "
                        "<out>/<name>/results.json (e.g. --out study for the committed figures)")
    return parser.parse_args(argv)


def redraw(out_dir: str) -> int:
    path = os.path.join(out_dir, "results.json")
    if not os.path.isfile(path):
        raise ConfigError(f"--redraw: no {path}: run the study first, or give --out the folder that holds <name>/")
    with open(path) as f:
        results = json.load(f)
    write_results(out_dir, results)
    print(f"Drew {', '.join(write_plots(out_dir, results))} and {os.path.join(out_dir, 'results.md')} again.",
          flush=True)
    return 0


def study(argv: list[str]) -> int:
    args = parse_args(argv)
    spec = load_spec(args.spec)
    if args.gate and not spec.gate.enabled:
        raise ConfigError(f"--gate: the spec {args.spec} says gate.enabled=false (its tasks name no kind), so it has "
                          f"no gate to measure")
    name = spec.name + ("_quick" if args.quick else "") + ("" if args.scale == "cpu" else f"_{args.scale}")
    out_dir = os.path.abspath(os.path.join(args.out, name))
    if args.redraw:
        return redraw(out_dir)
    runs_dir = os.path.join(out_dir, "runs")
    runs = plan_runs(spec, runs_dir, args.quick, args.scale)
    budget, total_steps = check_runs(runs)
    chosen = chosen_runs(runs, args.arms, args.seeds)
    if spec.gate.enabled:
        gate = gated(spec, args, runs, out_dir)
        if args.gate:
            return 0 if gate["passed"] else 2
        if not gate["passed"]:
            raise ConfigError(f"the gate failed ({os.path.join(out_dir, 'gate.md')}): the teacher is not better than "
                              f"the student because of its context, so the grid would not measure the methods")
    else:
        print(f"study {name}: ungated (gate.enabled=false): its teacher was not shown better than its student, so "
              f"its results are no evidence about the methods", flush=True)
    print(f"study {name}: {len(chosen)} runs, budget {budget}, into {out_dir}", flush=True)
    if args.collect:
        chosen = [run for run in chosen if is_finished(os.path.join(runs_dir, run.run_id), total_steps[run.run_id])]
    failed = [] if args.collect else run_grid(chosen, runs_dir, total_steps, args)
    results = collect(name, chosen, runs_dir, budget, failed)
    write_results(out_dir, results)
    if results["arms"]:
        write_plots(out_dir, results)
    print(open(os.path.join(out_dir, "results.md")).read(), flush=True)
    return 1 if failed else 0


def run_grid(runs: list, runs_dir: str, total_steps: dict[str, int], args: argparse.Namespace) -> list[str]:
    """The runs here or as jobs of the cluster at --address; the ids of those that failed."""
    from lopd_ray.config import load_config
    from lopd_ray.preflight import training_resources
    from lopd_ray.study.launch import Jobs, Local

    if args.parallel < 0:
        raise ConfigError(f"--parallel {args.parallel}: give 1 or more runs at once (0: the default)")
    launcher = Jobs(args.address) if args.address else Local()
    parallel = args.parallel or (len(runs) if args.address else 1)
    asks = {run.run_id: training_resources(load_config(run.recipe, run.overrides)) for run in runs}
    return run_all(runs, runs_dir, total_steps, launcher, max(1, parallel), asks)


def chosen_runs(runs: list, arms: str, seeds: str) -> list:
    """The runs of the comma-separated `arms` and `seeds` (each: all when empty)."""
    chosen = []
    for flag, given, of in (("--arms", arms, lambda run: run.arm), ("--seeds", seeds, lambda run: str(run.seed))):
        names = given.split(",") if given else sorted({of(run) for run in runs})
        unknown = sorted(set(names) - {of(run) for run in runs})
        if unknown:
            raise ConfigError(f"{flag}: {unknown} are not in this grid, which has {sorted({of(run) for run in runs})}")
        chosen.append(set(names))
    return [run for run in runs if run.arm in chosen[0] and str(run.seed) in chosen[1]]


def gated(spec, args, runs, out_dir: str) -> dict:
    """The gate of `out_dir`: measured anew with --gate or when none was measured before."""
    path = os.path.join(out_dir, "gate.json")
    if args.gate or not os.path.exists(path):
        print("gate: scoring the base model on the held-out split under each context", flush=True)
        gate = run_gate(spec, runs, out_dir)
    else:
        with open(path) as f:
            gate = json.load(f)
        print(f"gate: measured before ({path}), kept", flush=True)
    print(markdown(gate), flush=True)
    return gate


main = command(study)


if __name__ == "__main__":
    sys.exit(main())
