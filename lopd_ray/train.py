"""`python -m lopd_ray.train RECIPE.yaml [key=value ...] [--check]`: validate the config, connect to Ray, train.

The same line runs on a laptop (a local Ray cluster is started) and behind `ray job submit` (the job's cluster is
used). Every config problem is reported in one line before any actor starts. `--check` stops after the checks that
need no cluster (the schema, the names, the keys the algorithm reads, the model and the env's prompts).
"""
from __future__ import annotations

import json
import sys

from lopd_ray.errors import ConfigError
from lopd_ray.preflight import training_groups, training_resources
from lopd_ray.startup import command, recipe_and_overrides, start

USAGE = "usage: python -m lopd_ray.train [RECIPE.yaml] [key=value ...]\n\n" + (__doc__ or "")


def refuse_resume_past_the_end(cfg) -> None:
    """A resume at or past train.total_steps would start every actor to train nothing."""
    from lopd_ray.utils.checkpoint import CheckpointManager

    directory = CheckpointManager(cfg.run_dir).resolve(cfg.run.resume)
    step = CheckpointManager.step_of(directory) if directory else 0
    if step >= cfg.train.total_steps:
        raise ConfigError(f"run.resume={cfg.run.resume} continues from {directory} at step {step}, which is not below "
                          f"train.total_steps={cfg.train.total_steps}: raise train.total_steps to train on, set "
                          f"run.resume=off to start over, or give another run.name")


def train(argv: list[str]) -> int:
    from lopd_ray.controller import Controller

    check_only = "--check" in argv
    argv = [a for a in argv if a != "--check"]
    cfg, _ = start(*recipe_and_overrides(argv, USAGE), groups=training_groups, check=refuse_resume_past_the_end,
                   connect=not check_only)
    where = {"run_dir": cfg.run_dir, **({"kept_at": cfg.run_uri} if cfg.run_uri else {})}
    print(json.dumps({**where, "resources": training_resources(cfg),
                      **({"checked": True} if check_only else {})}), flush=True)
    if check_only:
        return 0
    controller = Controller(cfg)
    try:
        controller.run_or_name_the_lost_actor()
    finally:
        controller.shutdown()
    print(json.dumps({**where, "finished": True}), flush=True)
    return 0


main = command(train)


if __name__ == "__main__":
    sys.exit(main())
