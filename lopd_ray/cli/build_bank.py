"""`python -m lopd_ray.build_bank RECIPE.yaml --out DIR [--samples-per-task N] [key=value ...]`

Rolls the configured model out on every task of the env's train split, keeps the successful trajectories
(reward >= bank.success_threshold) and snapshots them as an experience bank into DIR.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from lopd_ray.config import Config
from lopd_ray.errors import ConfigError, RolloutError
from lopd_ray.preflight import check_bank_output
from lopd_ray.startup import add_recipe_argument, command, settle_recipe, start


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lopd_ray.build_bank", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_argument(parser)
    parser.add_argument("--out", required=True, help="directory the bank snapshot is written to")
    parser.add_argument("--samples-per-task", type=int, default=None,
                        help="rollouts per task (default: train.samples_per_prompt)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    args = parser.parse_intermixed_args(argv)
    settle_recipe(args, parser)
    return args


def rollout_train_split(cfg: Config, model_path: str, samples_per_task: int) -> list:
    from lopd_ray.actors import build_rollout_workers
    from lopd_ray.data.sampler import sample_seed
    from lopd_ray.envs import make_env
    from lopd_ray.rollout.worker import RolloutRequest
    from lopd_ray.utils.logs import phase

    _, tasks = make_env(cfg.env)
    requests = [RolloutRequest(i, i, sample_seed(cfg.train.seed, 0, i * samples_per_task + k))
                for i in range(len(tasks)) for k in range(samples_per_task)]
    with phase(f"starting {cfg.rollout.num_workers} rollout workers"):
        workers = build_rollout_workers(cfg, model_path)
    try:
        return workers.spread("rollout", requests, "train-split episodes")
    finally:
        workers.call("shutdown")
        workers.release()


def build(cfg: Config, model_path: str, out_dir: str, samples_per_task: int) -> dict[str, int]:
    from lopd_ray.bank.bank import ExperienceBank
    from lopd_ray.bank.traces import entries_from_successes
    from lopd_ray.envs import make_env

    bank = ExperienceBank(cfg.bank)  # loads the embedder first: a bad bank.embedder_path fails before rollouts
    trajs = rollout_train_split(cfg, model_path, samples_per_task)
    _, tasks = make_env(cfg.env)
    entries = entries_from_successes(trajs, cfg.bank)
    if not entries:
        best = max((t.reward for t in trajs), default=0.0)
        raise RolloutError(f"none of the {len(trajs)} train-split episodes reached bank.success_threshold="
                           f"{cfg.bank.success_threshold:g} (best reward {best:.3g}); nothing written to {out_dir}. "
                           f"Raise --samples-per-task, lower bank.success_threshold, or start from a model that "
                           f"solves some train tasks; a training run may also start from an empty bank, which fills "
                           f"with its successes")
    added = bank.add(entries)
    bank.snapshot(out_dir)
    return {"tasks": len(tasks), "rollouts": len(trajs), "successful": len(entries), "added": added,
            "tasks_in_bank": len({e.task_id for e in bank.entries})}


def check_build(cfg: Config, samples_per_task: int, out: Optional[str] = None) -> None:
    if cfg.env.split != "train":
        raise ConfigError(f"env.split='{cfg.env.split}': the bank is built from the train split only "
                          f"(evaluation tasks never enter it); drop the env.split override")
    if samples_per_task < 1:
        raise ConfigError(f"--samples-per-task={samples_per_task} must be >= 1")
    if out is not None:
        check_bank_output(out)


def build_bank(argv: list[str]) -> int:
    args = parse_args(argv)
    samples = lambda cfg: cfg.train.samples_per_prompt if args.samples_per_task is None else args.samples_per_task
    cfg, model_path = start(args.recipe, args.overrides, groups=lambda cfg: ("rollout",), command_reads=("bank",),
                            check=lambda cfg: check_build(cfg, samples(cfg), args.out))
    counts = build(cfg, model_path, args.out, samples(cfg))
    print(f"Bank built into {args.out}: {counts['successful']} of {counts['rollouts']} episodes on the "
          f"{counts['tasks']} train tasks reached bank.success_threshold={cfg.bank.success_threshold:g}; "
          f"{counts['added']} entries added, from {counts['tasks_in_bank']} tasks. Start a run from it with "
          f"bank.init_path={args.out}", flush=True)
    return 0


main = command(build_bank)


if __name__ == "__main__":
    sys.exit(main())
