"""`python -m lopd_ray.train RECIPE.yaml [key=value ...] [--check]`: validate the config, connect to Ray, train.

The same line runs on a laptop (a local Ray cluster is started) and behind `ray job submit` (the job's cluster is
used). Every config problem is reported in one line before any actor starts. The run folder is held by one run at a
time (lopd_ray/utils/run_lock.py). `--check` stops after the checks that need no cluster (the schema, the names, the
keys the algorithm reads, the model, its weights file and the env's prompts, that no run holds the folder).
"""
from __future__ import annotations

import os
import sys
import time

from lopd_ray.errors import ConfigError
from lopd_ray.preflight import models_to_build, training_groups, training_resources
from lopd_ray.reporting import console
from lopd_ray.startup import command, recipe_and_overrides, start
from lopd_ray.utils.run_lock import RunFolderLock, refuse_a_held_run_folder

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


def run_end(cfg, seconds: float, resumed_at: int) -> str:
    from lopd_ray.utils.checkpoint import CheckpointManager

    export = os.path.join(cfg.run_dir, "export")
    latest = CheckpointManager(cfg.run_dir).resolve("auto")
    return console.run_summary(cfg.run_dir, seconds, cfg.samples_per_step, latest,
                               export if cfg.run.export_student and os.path.isdir(export) else None, cfg.run_uri,
                               resumed_at)


def train(argv: list[str]) -> int:
    from lopd_ray.controller import Controller

    started = time.perf_counter()
    check_only = "--check" in argv
    argv = [a for a in argv if a != "--check"]
    folder = RunFolderLock()

    def own_the_run_folder_then_check(cfg) -> None:
        """The folder is claimed before anything in it is read, and before Ray starts."""
        if check_only:
            refuse_a_held_run_folder(cfg.run_dir)
        else:
            folder.acquire(cfg.run_dir)
        refuse_resume_past_the_end(cfg)

    try:
        cfg, _ = start(*recipe_and_overrides(argv, USAGE), groups=training_groups,
                       check=own_the_run_folder_then_check, connect=not check_only)
        if check_only:
            print(console.check_result(cfg.run_dir, training_resources(cfg), models_to_build(cfg, training_groups(cfg)),
                                       cfg.run_uri), flush=True)
            return 0
        print(console.run_start(cfg.run_dir, training_resources(cfg), cfg.run_uri), flush=True)
        controller = Controller(cfg)
        try:
            controller.run_or_name_the_lost_actor()
        finally:
            controller.shutdown()
        print(run_end(cfg, time.perf_counter() - started, controller.start_step), flush=True)
        return 0
    finally:
        folder.release()


main = command(train)


if __name__ == "__main__":
    sys.exit(main())
