"""`python -m lopd_ray.eval --model DIR --bench NAME [--n N] [--out DIR] [key=value ...]`

Runs a model through the rollout workers on a benchmark's evaluation split and writes `tasks.jsonl` (one line per
task: reward, turns, the benchmark's own verdict fields) and `summary.json` with the benchmark's aggregate.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Benchmark:
    env_overrides: tuple[str, ...]
    aggregate: str        # what the mean reward x 100 is called by the benchmark's own reports
    max_new_tokens: int


BENCHMARKS = {
    "humaneval": Benchmark(("env.name=code", "env.subset=humaneval", "env.split=test"), "EvalPlus pass@1 (base+plus)", 512),
    "mbpp": Benchmark(("env.name=code", "env.subset=mbpp", "env.split=test"), "EvalPlus pass@1 (base+plus)", 512),
    "bfcl": Benchmark(("env.name=bfcl_multiturn", "env.max_turns=32"), "BFCL multi-turn pooled accuracy", 256),
    "envscaler": Benchmark(("env.name=envscaler", "env.split=test", "env.max_turns=16"),
                           "EnvScaler-format mean reward x 100", 256),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lopd_ray.eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="HF model directory or builtin:<name>")
    parser.add_argument("--bench", required=True, choices=sorted(BENCHMARKS))
    parser.add_argument("--n", type=int, default=0, help="the first N tasks only (0: all)")
    parser.add_argument("--out", default=None, help="output directory (default: runs/eval/<bench>)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser.parse_intermixed_args(argv)


def summarize(bench: str, rows: list[dict], seconds: float) -> dict:
    rewards = np.asarray([r["reward"] for r in rows], dtype=np.float64)
    return {"bench": bench, "aggregate_name": BENCHMARKS[bench].aggregate,
            "aggregate": float(rewards.mean() * 100) if len(rows) else 0.0,
            "tasks": len(rows), "solved": int((rewards >= 1.0).sum()), "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    import ray

    from lopd_ray.actors import build_rollout_workers
    from lopd_ray.config import ConfigError, load_config, validate_model
    from lopd_ray.envs import make_env
    from lopd_ray.rollout.worker import RolloutRequest
    from lopd_ray.train import connect_ray
    from lopd_ray.utils.runtime import apply_runtime_env, single_thread_torch

    args = parse_args(sys.argv[1:] if argv is None else argv)
    apply_runtime_env()
    single_thread_torch()
    bench = BENCHMARKS[args.bench]
    try:
        cfg = load_config(None, [f"model.path={args.model}", f"rollout.max_new_tokens={bench.max_new_tokens}",
                                 "rollout.max_model_len=8192", "learner.max_tokens_per_micro_batch=8192",
                                 *bench.env_overrides, *args.overrides])
        _, tasks = make_env(cfg.env)
        model_dir = validate_model(cfg)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    out_dir = args.out or os.path.join("runs", "eval", args.bench)
    os.makedirs(out_dir, exist_ok=True)
    count = min(args.n or len(tasks), len(tasks))
    connect_ray(cfg)
    started = time.perf_counter()
    workers = build_rollout_workers(cfg, model_dir)
    try:
        requests = [RolloutRequest(i, i, i) for i in range(count)]
        parts = ray.get([w.evaluate.remote(requests[k::len(workers)], args.temperature)
                         for k, w in enumerate(workers)])
    finally:
        ray.get([w.shutdown.remote() for w in workers])
    trajs = sorted((t for part in parts for t in part), key=lambda t: t.info["task_index"])
    rows = [{"task_id": t.task_id, "reward": t.reward, "turns": t.info.get("turns"),
             "truncated": t.info.get("truncated"), "response_tokens": t.num_action_tokens,
             **{k: v for k, v in t.info.items() if k not in ("task_text", "action_texts", "observation_texts", "uid")
                and isinstance(v, (str, int, float, bool, list))},
             "answer": (t.info.get("action_texts") or [""])[-1]} for t in trajs]
    with open(os.path.join(out_dir, "tasks.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    summary = {"model": args.model, **summarize(args.bench, rows, time.perf_counter() - started),
               "subset": f"first {count} of {len(tasks)}" if count < len(tasks) else "all",
               "temperature": args.temperature, "overrides": args.overrides}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
