"""lopd_ray's GRPO step against TRL's GRPOTrainer on this machine: the same model, prompts, reward and batch.

    pip install -e ".[bench]"
    python benchmarks/vs_trl.py [--models tiny,4m] [--engines vllm,hf] [--steps 12] [--warmup 3] [--out FILE.json]

Both train the letters task (the same train prompts through the same chat template, the same reward function) with
8 prompts x 4 samples x 64 new tokens a step, GRPO at lr 1e-5, temperature 1. TRL runs with its defaults in one
process (HF generate, torch's default threads) except two GPU-minded ones, both slower on CPU: float32 like
lopd_ray instead of bf16 autocast, and no gradient checkpointing; lopd_ray runs `python -m lopd_ray.train recipes/grpo_letters_cpu.yaml`
(2 rollout workers with each engine of `--engines`, 2 DeepSpeed learners on gloo, the weight-sync probe at its
default frequency). Each
side is a fresh process; its seconds per step are the wall-clock means after the warm-up steps. Models: the built-in
tiny Qwen3 and a ~4M-parameter one of the same family built at random.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import results_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS, SAMPLES, NEW_TOKENS, LR = 8, 4, 64, 1.0e-5
FOUR_M = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64)


def model_dirs(names: list[str], scratch: str) -> dict[str, str]:
    from lopd_ray.models import resolve_model_path
    from lopd_ray.models.tiny import write_random_model
    from lopd_ray.models.tiny_tokenizer import ASSET_DIR

    known = {"tiny": lambda: resolve_model_path("builtin:tiny-qwen3"),
             "4m": lambda: write_random_model(os.path.join(scratch, "qwen3-4m"), "qwen3", FOUR_M, ASSET_DIR, seed=0)}
    return {name: known[name]() for name in names}


def parameters(model_dir: str) -> int:
    import math

    from safetensors import safe_open

    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


# ---- TRL side (a process of its own) -------------------------------------------------------------------------
def trl_main(model_dir: str, steps: int, out_json: str) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lopd_ray.config import EnvConfig
    from lopd_ray.envs.letters import letters_reward, make_letters

    _, tasks = make_letters(EnvConfig(name="letters", split="train"))
    rows = [{"prompt": tasks[i].messages, "letter": tasks[i].meta["letter"], "count": tasks[i].meta["count"]}
            for i in range(len(tasks))]

    def reward(completions, letter, count, **_):
        return [letters_reward(c[0]["content"], l, n) for c, l, n in zip(completions, letter, count)]

    stamps = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl_bench_"), per_device_train_batch_size=PROMPTS * SAMPLES,
                      num_generations=SAMPLES, max_completion_length=NEW_TOKENS, learning_rate=LR, max_steps=steps,
                      use_cpu=True, report_to=[], save_strategy="no", logging_steps=1, seed=0,
                      disable_tqdm=True, bf16=False, gradient_checkpointing=False)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=reward, args=args,
                          train_dataset=Dataset.from_list(rows),
                          processing_class=AutoTokenizer.from_pretrained(model_dir, padding_side="left"),
                          callbacks=[Stamp()])
    stamps.append(time.perf_counter())
    trainer.train()
    with open(out_json, "w") as f:
        json.dump({"stamps": stamps}, f)


def trl_seconds_per_step(model_dir: str, steps: int, warmup: int) -> float:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        subprocess.run([sys.executable, __file__, "--trl-run", model_dir, str(steps), out.name], check=True, env=env,
                       cwd=REPO)
        stamps = json.load(open(out.name))["stamps"]
    return statistics.fmean(b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1:]))


# ---- lopd_ray side -------------------------------------------------------------------------------------------
def lopd_seconds_per_step(model_dir: str, steps: int, warmup: int, overrides: list[str]) -> dict[str, float]:
    from lopd_ray.utils.metrics import read_metrics

    with tempfile.TemporaryDirectory(prefix="lopd_bench_") as out_dir:
        subprocess.run([sys.executable, "-m", "lopd_ray.train", "recipes/grpo_letters_cpu.yaml",
                        f"model.path={model_dir}", f"run.output_dir={out_dir}", "run.name=vs_trl", "run.resume=off",
                        f"train.total_steps={steps}", f"train.prompts_per_step={PROMPTS}",
                        f"train.samples_per_prompt={SAMPLES}", f"rollout.max_new_tokens={NEW_TOKENS}",
                        f"learner.lr={LR}", "rollout.temperature=1.0", "run.checkpoint_every_steps=0",
                        "run.export_student=false", "run.progress_bar=false", "run.loggers=[]", *overrides],
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        rows = read_metrics(os.path.join(out_dir, "vs_trl"))[warmup:]
    mean = lambda key: statistics.fmean(r.get(key, 0.0) for r in rows)
    return {"s_per_step": mean("timing_s/wall"),
            **{k: mean(k) for k in sorted({k for r in rows for k in r}) if k.startswith("timing_s/")}}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--trl-run"]:
        trl_main(argv[1], int(argv[2]), argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,4m")
    parser.add_argument("--engines", default="vllm,hf")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/vs_trl.json")
    parser.add_argument("overrides", nargs="*", help="key=value settings for the lopd_ray side")
    args = parser.parse_args(argv)
    results = {"batch": {"prompts": PROMPTS, "samples": SAMPLES, "max_new_tokens": NEW_TOKENS, "lr": LR},
               "steps": args.steps, "warmup": args.warmup, "overrides": args.overrides, "models": {}}
    with tempfile.TemporaryDirectory(prefix="vs_trl_models_") as scratch:
        for name, model_dir in model_dirs(args.models.split(","), scratch).items():
            trl = trl_seconds_per_step(model_dir, args.steps, args.warmup)
            row = results["models"][name] = {"parameters": parameters(model_dir), "trl_s_per_step": trl}
            for engine in args.engines.split(","):
                ours = lopd_seconds_per_step(model_dir, args.steps, args.warmup,
                                             [f"rollout.engine={engine}", *args.overrides])
                row[engine] = {"s_per_step": ours["s_per_step"], "ratio": ours["s_per_step"] / trl, "stages": ours}
                print(f"{name:5s} {row['parameters'] / 1e6:6.2f}M params  TRL {trl:.3f} s/step  lopd_ray ({engine}) "
                      f"{ours['s_per_step']:.3f} s/step  ratio {row[engine]['ratio']:.2f}", flush=True)
    results_file.write(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
