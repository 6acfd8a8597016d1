"""The composer's cold start (METHOD 2.4), as a command and as the optional first phase of a run.

    python -m lopd_ray.teacher.cold_start RECIPE.yaml --out PHI.pt [key=value ...]

Trains phi so that the frozen teacher, given the latents of a task's retrieved experience, produces a known-good
answer (the env's reference solutions, which also seed the bank); writes phi_0 for `composer.init_path`.
"""
from __future__ import annotations

import argparse
import json
import sys

import ray

from lopd_ray.bank.traces import composer_input_text
from lopd_ray.rollout.agent_loop import first_user_text


def cold_start_examples(bank, tasks, bank_cfg) -> list[dict]:
    """{"task_index", "answer", "retrieved_texts"} for the seeded tasks that have a reference solution and
    retrieved experience (never their own)."""
    indices = [i for i in range(min(bank_cfg.seed_references, len(tasks))) if tasks.reference_solution(i) is not None]
    found = ray.get(bank.retrieve.remote([first_user_text(tasks[i]) for i in indices], bank_cfg.top_j,
                                         [tasks[i].task_id for i in indices]))
    return [{"task_index": i, "answer": tasks.reference_solution(i),
             "retrieved_texts": [composer_input_text(e) for e in entries]}
            for i, entries in zip(indices, found) if entries]


def main(argv: list[str] | None = None) -> int:
    from lopd_ray.actors import build_bank, build_teachers
    from lopd_ray.config import ConfigError, load_config
    from lopd_ray.envs import make_env
    from lopd_ray.models import resolve_model_path
    from lopd_ray.train import connect_ray
    from lopd_ray.utils.runtime import apply_runtime_env, single_thread_torch

    parser = argparse.ArgumentParser(prog="python -m lopd_ray.teacher.cold_start", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe")
    parser.add_argument("--out", required=True, help="file phi_0 is written to (torch.save of the phi state)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    apply_runtime_env()
    single_thread_torch()
    try:
        cfg = load_config(args.recipe, args.overrides)
        if cfg.composer.cold_start_steps < 1 or cfg.bank.seed_references < 1:
            raise ConfigError("composer.cold_start_steps and bank.seed_references must be >= 1 for a cold start")
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    connect_ray(cfg)
    from lopd_ray.controller import seed_bank

    _, tasks = make_env(cfg.env)
    bank, teachers = build_bank(cfg), []
    try:
        seed_bank(bank, tasks, cfg.bank)
        examples = cold_start_examples(bank, tasks, cfg.bank)
        teachers = build_teachers(cfg, resolve_model_path(cfg.model.path))
        stats = ray.get([t.cold_start.remote(examples, cfg.composer.cold_start_steps) for t in teachers])[0]
        ray.get(teachers[0].save_phi.remote(args.out))
    finally:
        for actor in [bank, *teachers]:
            ray.kill(actor)
    print(json.dumps({"out": args.out, **stats}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
