"""Rollout throughput by mode: env steps one at a time vs side by side (rollout.env_concurrency), synchronous vs
asynchronous training (train.mode), on a tool-use env whose calls take wall-clock time, and the demos' reward curves
in both training modes.

    python benchmarks/rollout_modes.py [--part agentic,demos] [--latency 0.2] [--out FILE.json]

agentic: GRPO on the EnvScaler-format suite with `builtin:tiny-qwen3-envscaler` (8 tasks x 4 episodes a step, at
most 8 turns), every env step waiting `--latency` seconds first (env.step_latency_s, as a remote tool or sandbox
call would); episodes per second over the steps after the first, for: the baseline (sync, one env step at a time),
env steps side by side (sync), that plus asynchronous training, and both again with each episode's next turn
generated as soon as its own step returns (rollout.turns=continuous). demos: `make demo` and `make demo-grpo`'s
recipes (letters, 30 steps) in train.mode=sync and async: mean reward over the first and the last 5 steps, and the
wall-clock seconds per step. Every run is `python -m lopd_ray.train` in a temporary directory.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import results_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AGENTIC = ["model.path=builtin:tiny-qwen3-envscaler", "env.name=envscaler", "env.envscaler.max_turns=8",
           "env.envscaler.tool_listing=signatures", "rollout.max_new_tokens=96", "rollout.max_model_len=2048",
           "learner.max_tokens_per_micro_batch=4096", "learner.lr=1.0e-3", "train.prompts_per_step=8",
           "train.samples_per_prompt=4"]
AGENTIC_ARMS = {"baseline": ["train.mode=sync", "rollout.env_concurrency=1"],
                "concurrent_env_steps": ["train.mode=sync", "rollout.env_concurrency=16"],
                "concurrent_and_async": ["train.mode=async", "rollout.env_concurrency=16"],
                "continuous_turns": ["train.mode=sync", "rollout.env_concurrency=16", "rollout.turns=continuous"],
                "continuous_and_async": ["train.mode=async", "rollout.env_concurrency=16",
                                         "rollout.turns=continuous"]}
DEMOS = {"grpo": "recipes/grpo_letters_cpu.yaml", "lopd": "recipes/lopd_letters_cpu.yaml"}


def train(recipe: str, overrides: list[str]) -> list[dict]:
    from lopd_ray.utils.metrics import read_metrics

    with tempfile.TemporaryDirectory(prefix="lopd_modes_") as out_dir:
        subprocess.run([sys.executable, "-m", "lopd_ray.train", recipe, f"run.output_dir={out_dir}", "run.name=b",
                        "run.resume=off", "run.checkpoint_every_steps=0", "run.export_student=false",
                        "run.progress_bar=false", "run.loggers=[]", *overrides],
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        return read_metrics(os.path.join(out_dir, "b"))


def agentic(latency: float, steps: int) -> dict:
    out = {}
    for arm, overrides in AGENTIC_ARMS.items():
        rows = train("recipes/grpo_letters_cpu.yaml",
                     [*AGENTIC, f"env.step_latency_s={latency}", f"train.total_steps={steps}", *overrides])
        episodes = 8 * 4
        wall = statistics.fmean(r["timing_s/wall"] for r in rows[1:])
        out[arm] = {"episodes_per_s": episodes / wall, "s_per_step": wall,
                    "response_tokens_mean": statistics.fmean(r["rollout/response_tokens_mean"] for r in rows),
                    "reward": [r["rollout/reward_mean"] for r in rows]}
        print(f"agentic {arm:22s} {out[arm]['episodes_per_s']:.2f} episodes/s ({wall:.2f} s/step)", flush=True)
    base = out["baseline"]["episodes_per_s"]
    for arm in out:
        out[arm]["speedup"] = out[arm]["episodes_per_s"] / base
    return out


def demos() -> dict:
    out = {}
    for name, recipe in DEMOS.items():
        for mode in ("sync", "async"):
            rows = train(recipe, [f"train.mode={mode}"])
            rewards = [r["rollout/reward_mean"] for r in rows]
            out[f"{name}_{mode}"] = {"first5": statistics.fmean(rewards[:5]), "last5": statistics.fmean(rewards[-5:]),
                                     "s_per_step": statistics.fmean(r["timing_s/wall"] for r in rows[1:]),
                                     "reward": rewards}
            row = out[f"{name}_{mode}"]
            print(f"demo {name} {mode:5s} reward {row['first5']:.2f} -> {row['last5']:.2f}  "
                  f"{row['s_per_step']:.2f} s/step", flush=True)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", default="agentic,demos")
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--steps", type=int, default=4, help="agentic steps per arm")
    parser.add_argument("--out", default="benchmarks/results/rollout_modes.json")
    args = parser.parse_args(argv)
    results = {"latency_s": args.latency}
    parts = args.part.split(",")
    if "agentic" in parts:
        results["agentic"] = agentic(args.latency, args.steps)
    if "demos" in parts:
        results["demos"] = demos()
    results_file.write(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
