"""`python -m lopd_ray.cold_start RECIPE.yaml --out PHI.pt [key=value ...]`: the composer's cold start (METHOD 2.4).

Trains phi so that the frozen teacher, given the latents of a task's retrieved experience, produces a known-good
answer (the env's reference solutions, which also seed the bank); writes phi_0 for `composer.init_path`, and the
cold start's losses (the reference answers' NLL at its first and last step) as cold_start.json in the run directory
(run.output_dir/run.name). A run with `composer.cold_start_steps > 0` does the same as its first phase.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from lopd_ray.config import Config
from lopd_ray.errors import ConfigError
from lopd_ray.startup import command, start

READS = ("bank", "composer", "teacher")


def summary_path(run_dir: str) -> str:
    """Where the command writes its losses: {"out": PHI.pt, "cold_start/nll_first": .., "cold_start/nll_last": ..}
    (the study's gate reads it there)."""
    return os.path.join(run_dir, "cold_start.json")


def check_cold_start(cfg: Config) -> None:
    if cfg.composer.cold_start_steps < 1 or cfg.bank.seed_references < 1:
        raise ConfigError("composer.cold_start_steps and bank.seed_references must be >= 1 for a cold start")


def cold_start(argv: list[str]) -> int:
    from lopd_ray.actors import build_bank, build_teachers
    from lopd_ray.bank.seeding import cold_start_examples, cold_start_plan, seed_bank
    from lopd_ray.bank.traces import ComposerInputs
    from lopd_ray.envs import make_env
    from lopd_ray.utils.logs import phase

    parser = argparse.ArgumentParser(prog="python -m lopd_ray.cold_start", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe")
    parser.add_argument("--out", required=True, help="file phi_0 is written to (torch.save of the phi state)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_intermixed_args(argv)
    cfg, model_path = start(args.recipe, args.overrides, groups=lambda cfg: ("bank", "teacher"),
                            command_reads=READS, check=check_cold_start)
    _, tasks = make_env(cfg.env)
    with phase("starting the experience bank"):
        bank, teachers = build_bank(cfg), None
    try:
        seed_bank(bank, tasks, cfg.bank)
        examples = cold_start_examples(bank, tasks, cfg.bank, ComposerInputs(cfg.composer, model_path))
        with phase(f"starting {cfg.teacher.num_workers} teacher workers"):
            teachers = build_teachers(cfg, model_path)
        steps = cfg.composer.cold_start_steps
        with phase(cold_start_plan(cfg.composer, len(examples))):
            stats = teachers.call("cold_start", examples, steps)[0]
        teachers.first("save_phi", args.out)
    finally:
        bank.release()
        if teachers is not None:
            teachers.release()
    summary = {"out": args.out, "steps": steps, "examples": len(examples), **stats}
    os.makedirs(cfg.run_dir, exist_ok=True)
    with open(summary_path(cfg.run_dir), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"Composer cold start: {steps} steps on {len(examples)} reference solutions, their NLL "
          f"{stats.get('cold_start/nll_first', float('nan')):.3g} at the first step and "
          f"{stats.get('cold_start/nll_last', float('nan')):.3g} at the last. phi_0 is in {args.out} (a run starts "
          f"from it with composer.init_path={args.out}); the numbers are in {summary_path(cfg.run_dir)}.", flush=True)
    return 0


main = command(cold_start)


if __name__ == "__main__":
    sys.exit(main())
