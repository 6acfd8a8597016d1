"""A study's numbers: every run's held-out curve (from its eval.jsonl), each arm's mean and spread over seeds (and
its teacher's held-out reward, where its runs watched it: eval.teacher), written as results.json and results.md."""
from __future__ import annotations

import json
import os

import numpy as np

from lopd_ray.study.runner import eval_rows
from lopd_ray.study.spec import RunSpec
from lopd_ray.utils.atomic import write_file
from lopd_ray.utils.metrics import read_metrics

# Training metrics kept per run (means over its last DIAGNOSTIC_WINDOW steps) to read why an arm did what it did.
DIAGNOSTIC_PREFIXES = ("rollout/reward_mean", "lopd/", "distill/", "bank/", "composer/", "actor/kl", "timing_s/step")
DIAGNOSTIC_WINDOW = 5
# The arm whose final held-out reward the others' budgets are measured against.
REFERENCE_ARM = "grpo"
# The teacher's held-out reward in an eval.jsonl row (eval.teacher).
TEACHER = "teacher_reward_mean"


def diagnostics(run_dir: str) -> dict[str, float]:
    rows = read_metrics(run_dir)[-DIAGNOSTIC_WINDOW:]
    keys = sorted({k for r in rows for k in r if k.startswith(DIAGNOSTIC_PREFIXES)})
    return {k: float(np.mean([r[k] for r in rows if k in r])) for k in keys}


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def arm_summary(kind: str, curves: list[list[dict]]) -> dict:
    final = [c[-1] for c in curves]
    reward, reward_std = mean_std([r["reward_mean"] for r in final])
    solved, solved_std = mean_std([r["solved"] for r in final])
    return {"kind": kind, "seeds": len(curves),
            "initial_reward": mean_std([c[0]["reward_mean"] for c in curves])[0],
            "final_reward": reward, "final_reward_std": reward_std, "final_solved": solved,
            "final_solved_std": solved_std,
            **{key: mean_std([r[key] for r in final])[0] for key in ("episodes", "tokens", "train_seconds")},
            **teacher_ends(curves)}


def teacher_ends(curves: list[list[dict]]) -> dict:
    """The teacher's held-out reward at the first and at the last evaluation, means over the seeds that have it."""
    ends = {}
    for key, row in (("initial_teacher_reward", 0), ("final_teacher_reward", -1)):
        values = [c[row][TEACHER] for c in curves if TEACHER in c[row]]
        if values:
            ends[key] = mean_std(values)[0]
    return ends


def arm_curves(results: dict, arm: str, x_key: str, y_key: str = "reward_mean"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (mean over seeds), `y_key`'s mean and std at each evaluation the arm's seeds all reached."""
    curves = [r["curve"] for r in results["runs"].values() if r["arm"] == arm]
    points = min(len(c) for c in curves)
    x = np.mean([[row[x_key] for row in c[:points]] for c in curves], axis=0)
    y = np.asarray([[row[y_key] for row in c[:points]] for c in curves])
    return x, y.mean(axis=0), y.std(axis=0)


def watched_teacher(results: dict, arm: str) -> bool:
    """Whether every evaluation of the arm's runs scored its teacher too."""
    return all(TEACHER in row for r in results["runs"].values() if r["arm"] == arm for row in r["curve"])


def budget_to_reach(results: dict, arm: str, target: float) -> dict:
    """The first evaluation at which the arm's mean held-out reward reaches `target`: its episodes and training
    seconds (None where it never does)."""
    hits = {}
    for x_key in ("episodes", "train_seconds"):
        x, mean, _ = arm_curves(results, arm, x_key)
        reached = np.nonzero(mean >= target - 1e-9)[0]
        hits[x_key] = float(x[reached[0]]) if len(reached) else None
    return hits


def collect(name: str, runs: list[RunSpec], runs_dir: str, budget: dict, failed: list[str]) -> dict:
    """results.json's content; a failed run is listed as failed and left out of its arm's summary."""
    per_run, arms = {}, {}
    for run in runs:
        run_dir = os.path.join(runs_dir, run.run_id)
        if run.run_id in failed:
            continue
        rows = eval_rows(run_dir)
        per_run[run.run_id] = {"arm": run.arm, "kind": run.kind, "seed": run.seed, "recipe": run.recipe,
                               "overrides": list(run.overrides), "curve": rows, "diagnostics": diagnostics(run_dir)}
        arms.setdefault(run.arm, (run.kind, []))[1].append(rows)
    results = {"name": name, "budget": budget, "failed": failed, "cpus": os.cpu_count(),
               "arms": {arm: arm_summary(kind, curves) for arm, (kind, curves) in arms.items()}, "runs": per_run}
    if REFERENCE_ARM in results["arms"]:  # sample efficiency: the budget at which each arm passes GRPO's end
        target = results["arms"][REFERENCE_ARM]["final_reward"]
        for arm, summary in results["arms"].items():
            summary["to_reference_end"] = budget_to_reach(results, arm, target)
    return results


def markdown_table(results: dict) -> str:
    lines = ["| arm | kind | seeds | held-out reward, start | held-out reward, end | teacher's, start | "
             "teacher's, end | solved, end | episodes | tokens | train s | episodes to grpo's end |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, s in results["arms"].items():
        reach = s.get("to_reference_end", {}).get("episodes")
        teacher = " | ".join(f"{s[key]:.3f}" if key in s else "-"
                             for key in ("initial_teacher_reward", "final_teacher_reward"))
        lines.append(f"| {arm} | {s['kind']} | {s['seeds']} | {s['initial_reward']:.3f} | "
                     f"{s['final_reward']:.3f} ± {s['final_reward_std']:.3f} | {teacher} | "
                     f"{s['final_solved']:.3f} ± {s['final_solved_std']:.3f} | {s['episodes']:.0f} | "
                     f"{s['tokens']:.0f} | {s['train_seconds']:.0f} | {'-' if reach is None else f'{reach:.0f}'} |")
    if results["failed"]:
        lines.append(f"\nFailed runs (left out): {', '.join(results['failed'])}")
    return "\n".join(lines) + "\n"


def write_results(out_dir: str, results: dict) -> None:
    write_file(os.path.join(out_dir, "results.json"), json.dumps(results, indent=1) + "\n")
    write_file(os.path.join(out_dir, "results.md"), markdown_table(results))
