"""Step throughput of a recipe on this machine: seconds per stage, rollout and learner tokens per second.

    python benchmarks/step_throughput.py [RECIPE.yaml] [--steps 8] [--out FILE.json] [key=value ...]

RECIPE.yaml defaults to recipes/grpo_letters_cpu.yaml.

Runs the recipe for `--steps` steps on a local Ray cluster in a temporary run directory (removed afterwards), drops
the first step (engine warm-up) and prints and writes the means of the rest, and the CPU seconds per step of each
actor group and of the driver over the same steps (benchmarks/cpu_time.py).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import results_file
from cpu_time import CpuClock

from lopd_ray.preflight import training_groups
from lopd_ray.startup import add_recipe_argument, command, settle_recipe, start


def benchmark(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_argument(parser)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default="benchmarks/results/step_throughput.json")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_intermixed_args(argv)
    settle_recipe(args, parser, default="recipes/grpo_letters_cpu.yaml")

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
            clock = CpuClock(controller.actor_groups())
            log = controller.log

            def log_then_restart_clock_after_the_first_step(step, *rest):
                log(step, *rest)
                if step == 0:
                    clock.restart()
            controller.log = log_then_restart_clock_after_the_first_step
            controller.run()
            cpu = clock.per_step(args.steps - 1)
        finally:
            controller.shutdown()
        rows = read_metrics(cfg.run_dir)[1:]
    mean = lambda key: statistics.fmean(r.get(key, 0.0) for r in rows)  # a stage some steps skip counts 0 there
    stages = sorted({k for r in rows for k in r if k.startswith("timing_s/")})
    response_tokens = mean("rollout/response_tokens_mean") * cfg.samples_per_step
    result = {
        "recipe": args.recipe, "overrides": args.overrides, "steps_measured": len(rows), "startup_s": startup_s,
        **{k: mean(k) for k in stages},
        "perf/rollout_tokens_per_s": response_tokens / mean("timing_s/rollout"),
        "perf/learner_tokens_per_s": mean("actor/tokens") / mean("timing_s/learn"),
        "perf/samples_per_s": cfg.samples_per_step / mean("timing_s/step"),
        **cpu,
    }
    results_file.write(args.out, result)
    for key, value in result.items():
        print(f"{key:32s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(command(benchmark)())
