"""Step throughput of a recipe on this machine: seconds per stage, rollout and learner tokens per second.

    python benchmarks/step_throughput.py [--recipe recipes/grpo_letters_cpu.yaml] [--steps 8] [--out FILE.json] [k=v ...]

Runs the recipe for `--steps` steps on a local Ray cluster in a temporary run directory (removed afterwards), drops
the first step (engine warm-up) and prints and writes the means of the rest.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from lopd_ray.preflight import training_groups
from lopd_ray.startup import command, start


def benchmark(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="recipes/grpo_letters_cpu.yaml")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default="benchmarks/results/step_throughput.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)

    from lopd_ray.controller import Controller
    from lopd_ray.utils.metrics import read_metrics

    with tempfile.TemporaryDirectory(prefix="lopd_bench_") as out_dir:  # the run itself is not kept
        cfg, _ = start(args.recipe, [f"train.total_steps={args.steps}", f"run.output_dir={out_dir}",
                                     "run.resume=off", "run.checkpoint_every_steps=0", "run.progress_bar=false",
                                     "run.export_student=false", *args.overrides],
                       groups=training_groups)
        started = time.perf_counter()
        controller = Controller(cfg)
        startup_s = time.perf_counter() - started
        try:
            controller.run()
        finally:
            controller.shutdown()
        rows = read_metrics(cfg.run_dir)[1:]
    mean = lambda key: statistics.fmean(r[key] for r in rows)
    stages = sorted(k for k in rows[0] if k.startswith("timing_s/"))
    response_tokens = mean("rollout/response_tokens_mean") * cfg.samples_per_step
    result = {
        "recipe": args.recipe, "overrides": args.overrides, "steps_measured": len(rows),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "startup_s": startup_s,
        **{k: mean(k) for k in stages},
        "perf/rollout_tokens_per_s": response_tokens / mean("timing_s/rollout"),
        "perf/learner_tokens_per_s": mean("actor/tokens") / mean("timing_s/learn"),
        "perf/samples_per_s": cfg.samples_per_step / mean("timing_s/step"),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    for key, value in result.items():
        print(f"{key:32s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(command(benchmark)())
