"""`python -m lopd_ray.eval --model DIR --bench NAME [--n N] [--out DIR] [--check] [key=value ...]`

Runs a model through the rollout workers on a benchmark's evaluation split (NAME: a benchmark below, or any env
name, an env of one's own as module:ATTRIBUTE included, on its test split) and writes `tasks.jsonl` (one line per
task: reward, turns, the benchmark's own verdict fields) and `summary.json` with the benchmark's aggregate. The
episodes use the model's whole context (`rollout.max_model_len=0`) unless an override says otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from lopd_ray.startup import command, start


@dataclass(frozen=True)
class Benchmark:
    overrides: tuple[str, ...]     # the benchmark's env and answer length
    aggregate: str                 # what the mean reward x 100 is called by the benchmark's own reports


BENCHMARKS = {
    "humaneval": Benchmark(("env.name=code", "env.code.subset=humaneval", "env.split=test",
                            "rollout.max_new_tokens=512"), "EvalPlus pass@1 (base+plus)"),
    "mbpp": Benchmark(("env.name=code", "env.code.subset=mbpp", "env.split=test", "rollout.max_new_tokens=512"),
                      "EvalPlus pass@1 (base+plus)"),
    "bfcl": Benchmark(("env.name=bfcl_multiturn", "rollout.max_new_tokens=256"), "BFCL multi-turn pooled accuracy"),
    "envscaler": Benchmark(("env.name=envscaler", "env.split=test", "rollout.max_new_tokens=256"),
                           "EnvScaler-format mean reward x 100"),
    "letters": Benchmark(("env.name=letters", "env.split=train"),
                         "letters mean reward x 100 (its train prompts: letters has no held-out split)"),
    "rules": Benchmark(("env.name=rules", "env.split=test", "rollout.max_new_tokens=8"),
                       "rules exact-match accuracy x 100 (held-out inputs)"),
}


def benchmark(name: str) -> Benchmark:
    """A named benchmark, else the env `name` on its test split (env.split=... overrides it)."""
    return BENCHMARKS.get(name) or Benchmark((f"env.name={name}", "env.split=test"), f"{name} mean reward x 100")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lopd_ray.eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="HF model directory or builtin:<name>")
    parser.add_argument("--bench", required=True,
                        help=f"one of {', '.join(sorted(BENCHMARKS))}, or an env name (module:ATTRIBUTE for one's own)")
    parser.add_argument("--n", type=int, default=0, help="the first N tasks only (0: all)")
    parser.add_argument("--out", default=None, help="output directory (default: runs/eval/<bench>)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--check", action="store_true", help="check the model and the settings, then stop")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser.parse_intermixed_args(argv)


def output_dir(args: argparse.Namespace) -> str:
    return args.out or os.path.join("runs", "eval", args.bench.replace(":", "_"))


def eval_overrides(args: argparse.Namespace) -> list[str]:
    """The benchmark's settings; the output directory is the run directory (its logs/ included)."""
    out = os.path.abspath(output_dir(args))
    return [f"model.path={args.model}", "rollout.max_model_len=0", f"run.output_dir={os.path.dirname(out)}",
            f"run.name={os.path.basename(out)}", *benchmark(args.bench).overrides, *args.overrides]


def summarize(bench: str, rows: list[dict], seconds: float) -> dict:
    rewards = np.asarray([r["reward"] for r in rows], dtype=np.float64)
    return {"bench": bench, "aggregate_name": benchmark(bench).aggregate,
            "aggregate": float(rewards.mean() * 100) if len(rows) else 0.0,
            "tasks": len(rows), "solved": int((rewards >= 1.0).sum()),
            "failed": sum(r["error"] is not None for r in rows), "seconds": seconds}


def task_row(t) -> dict:
    verdicts = {k: v for k, v in t.info.items() if isinstance(v, (str, int, float, bool, list))}
    # An episode that failed (env or engine error, after rollout.max_retries) scores 0 and says why.
    return {"task_id": t.task_id, "reward": t.reward, "turns": t.num_turns, "truncated": t.truncated, "error": t.error,
            "response_tokens": t.num_action_tokens, **verdicts, "answer": (t.action_texts or [""])[-1]}


def subset(count: int, size: int, limit: int) -> str:
    """Which of the split's tasks ran: "all" only when every task of the split did (not cut by env.limit)."""
    if count == size and not limit:
        return "all"
    return f"first {count}" + (f" of {size}" if count < size else "") + (f" (env.limit={limit})" if limit else "")


def check_line(args: argparse.Namespace, model_dir: str) -> str:
    from lopd_ray.models import BUILTIN_PREFIX

    unbuilt = model_dir.startswith(BUILTIN_PREFIX)
    return (f"The evaluation checks out: {args.model} on {args.bench}" +
            (f"; the model is not built yet and would be built first (`python -m lopd_ray.build_model "
             f"model.path={model_dir}` builds it now)." if unbuilt else f" ({model_dir})."))


def result_line(summary: dict, out_dir: str) -> str:
    from lopd_ray.reporting.console import as_typed, duration

    failed = f", {summary['failed']} episodes failed (their errors are in tasks.jsonl)" if summary["failed"] else ""
    first, _, limit = summary["subset"].partition(" (")
    tasks = "all its tasks" if first == "all" else f"its {first} tasks" + (f" ({limit}" if limit else "")
    return (f"{summary['model']} on {summary['bench']} ({tasks}): {summary['aggregate_name']} "
            f"{summary['aggregate']:.1f}; {summary['solved']} of {summary['tasks']} tasks solved{failed}, in "
            f"{duration(summary['seconds'])}. Per task: {as_typed(os.path.join(out_dir, 'tasks.jsonl'))}; "
            f"the summary: {as_typed(os.path.join(out_dir, 'summary.json'))}.")


def evaluate(argv: list[str]) -> int:
    from lopd_ray.actors import build_rollout_workers
    from lopd_ray.envs import make_env
    from lopd_ray.rollout.worker import RolloutRequest
    from lopd_ray.utils.logs import phase

    args = parse_args(argv)
    cfg, model_dir = start(None, eval_overrides(args), groups=lambda cfg: ("rollout",), connect=not args.check)
    if args.check:
        print(check_line(args, model_dir), flush=True)
        return 0
    _, tasks = make_env(cfg.env)
    out_dir = cfg.run_dir
    os.makedirs(out_dir, exist_ok=True)
    count = min(args.n or len(tasks), len(tasks))
    started = time.perf_counter()
    with phase(f"starting {cfg.rollout.num_workers} rollout workers"):
        workers = build_rollout_workers(cfg, model_dir)
    try:
        requests = [RolloutRequest(i, i, i) for i in range(count)]
        trajs = workers.spread("evaluate", requests, f"{args.bench} episodes", args.temperature)
    finally:
        workers.call("shutdown")
        workers.release()
    rows = [task_row(t) for t in trajs]
    with open(os.path.join(out_dir, "tasks.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    summary = {"model": args.model, **summarize(args.bench, rows, time.perf_counter() - started),
               "subset": subset(count, len(tasks), cfg.env.limit),
               "temperature": args.temperature, "overrides": args.overrides}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(result_line(summary, out_dir), flush=True)
    return 0


main = command(evaluate)


if __name__ == "__main__":
    sys.exit(main())
