"""What a distillation method's step costs over GRPO's on the same batch.

    python benchmarks/method_cost.py [--method-recipe recipes/lopd_letters_cpu.yaml] [--steps 12] [--out FILE.json]

Runs `make demo`'s recipe (LOPD: retrieval, the teacher's scoring with the composer's latents, the composer's step,
the bank's growth) and GRPO on the very same batch (recipes/grpo_letters_cpu.yaml with the method recipe's model,
prompts, samples per prompt, tokens, learning rate and actors), one after the other, each through
benchmarks/step_throughput.py (a fresh local Ray cluster, the first step dropped). Prints and writes both recipes'
seconds per step by stage and the ratio of their wall-clock seconds per step.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import results_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRPO_RECIPE = "recipes/grpo_letters_cpu.yaml"
# The method recipe's settings GRPO takes over, so that both steps see the same batch on the same actors.
SHARED_KEYS = ("model.path", "train.prompts_per_step", "train.samples_per_prompt", "rollout.max_new_tokens",
               "rollout.num_workers", "rollout.cpus_per_worker", "learner.num_learners", "learner.cpus_per_learner",
               "learner.lr")


def shared_overrides(recipe: str) -> list[str]:
    from lopd_ray.config import load_config

    cfg = load_config(os.path.join(REPO, recipe))
    values = []
    for key in SHARED_KEYS:
        section, name = key.split(".")
        values.append(f"{key}={getattr(getattr(cfg, section), name)}")
    return values


def step_throughput(recipe: str, steps: int, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="lopd_cost_") as scratch:
        out = os.path.join(scratch, "result.json")
        subprocess.run([sys.executable, "benchmarks/step_throughput.py", recipe, "--steps", str(steps),
                        "--out", out, "run.loggers=[]", *overrides], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method-recipe", default="recipes/lopd_letters_cpu.yaml")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "method_cost.json"))
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    runs = {"method": step_throughput(args.method_recipe, args.steps, []),
            "grpo": step_throughput(GRPO_RECIPE, args.steps, shared_overrides(args.method_recipe))}
    stages = sorted({k for run in runs.values() for k in run if k.startswith(("timing_s/", "cpu_s_per_step/"))})
    print(f"{'stage':28s} {'method':>9s} {'grpo':>9s}")
    for key in stages:
        print(f"{key:28s} {runs['method'].get(key, 0.0):9.3f} {runs['grpo'].get(key, 0.0):9.3f}")
    ratio = runs["method"]["timing_s/wall"] / runs["grpo"]["timing_s/wall"]
    print(f"{args.method_recipe} step / GRPO step on the same batch: {ratio:.2f}x", flush=True)
    results_file.write(args.out, {"method_recipe": args.method_recipe, "grpo_recipe": GRPO_RECIPE,
                                  "grpo_overrides": shared_overrides(args.method_recipe), "steps": args.steps,
                                  "ratio": ratio, "runs": runs})


if __name__ == "__main__":
    main()
