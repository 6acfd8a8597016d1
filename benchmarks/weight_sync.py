"""Weight sync by method: seconds per push and GB/s of weights delivered, learner rank 0 -> the rollout workers.

    python benchmarks/weight_sync.py [--models tiny,4m,smollm2] [--methods object_store,collective] [--workers 2]
                                     [--engine vllm] [--pushes 10] [--out FILE.json]

One run of the trainer's actors per model (`recipes/grpo_letters_cpu.yaml`, one DeepSpeed learner, `--workers`
rollout workers on `--engine`) on a local Ray cluster of this machine. For each method: one push to warm up (the
collective method opens its channel there), then `--pushes` timed pushes of the learner's weights back to back,
their median the figure; GB/s counts the bytes of the weights once (what every worker ends up holding), as a broadcast's
throughput is usually quoted. After each method's last push the sync probe runs: the engines' log-probs of a sampled
batch against the learner's (sync/logprob_diff_*; float noise when the engines hold the learner's weights). Models:
the built-in tiny Qwen3, the ~4M one of benchmarks/vs_trl.py and SmolLM2-135M-Instruct (built from its GGUF).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import results_file
from vs_trl import FOUR_M, parameters

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model_dir(name: str, scratch: str) -> str:
    from lopd_ray.models import resolve_model_path
    from lopd_ray.models.tiny import write_random_model
    from lopd_ray.models.tiny_tokenizer import ASSET_DIR

    if name == "4m":
        return write_random_model(os.path.join(scratch, "qwen3-4m"), "qwen3", FOUR_M, ASSET_DIR, seed=0)
    return resolve_model_path({"tiny": "builtin:tiny-qwen3", "smollm2": "builtin:smollm2-135m-instruct"}[name])


def weight_bytes(path: str) -> int:
    """The bytes one push carries: every parameter in fp32, a tied head once more (engines get it by its name)."""
    import math

    from safetensors import safe_open

    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    tied_head = next((math.prod(v) for k, v in shapes.items() if k.endswith("embed_tokens.weight")), 0)
    return 4 * (sum(math.prod(v) for v in shapes.values()) + (0 if "lm_head.weight" in shapes else tied_head))


def measure(path: str, methods: list[str], workers: int, engine: str, pushes: int) -> dict:
    import ray

    from lopd_ray.config import load_config
    from lopd_ray.controller import Controller
    from lopd_ray.learner.weight_sync import WEIGHT_SYNCS

    out_dir = tempfile.mkdtemp(prefix="lopd_sync_")
    cfg = load_config(os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml"),
                      [f"model.path={path}", f"run.output_dir={out_dir}", "learner.num_learners=1",
                       f"rollout.num_workers={workers}", f"rollout.engine={engine}", "rollout.max_model_len=1024",
                       "run.progress_bar=false", "run.loggers=[]"])
    controller = Controller(cfg)
    nbytes = weight_bytes(path)
    results = {}
    try:
        for method in methods:
            sync = WEIGHT_SYNCS[method](cfg, controller.learners, controller.workers)
            start = time.perf_counter()
            sync.push(0)
            first = time.perf_counter() - start
            seconds = []
            for version in range(1, pushes + 1):
                start = time.perf_counter()
                sync.push(version)
                seconds.append(time.perf_counter() - start)
            probe = controller.probe_sync()
            median = statistics.median(seconds)
            results[method] = {"s_per_push": median, "s_per_push_mean": statistics.fmean(seconds),
                               "first_push_s": first, "gb_per_s": nbytes / median / 1e9, **probe}
            print(f"  {method:13s} {median:7.3f} s/push  {nbytes / median / 1e9:6.3f} GB/s  first {first:.3f} s  "
                  f"probe diff mean {probe['sync/logprob_diff_mean']:.2e} max {probe['sync/logprob_diff_max']:.2e}",
                  flush=True)
    finally:
        controller.shutdown()
        ray.shutdown()
    return {"weight_bytes": nbytes, "methods": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,4m,smollm2")
    parser.add_argument("--methods", default="object_store,collective")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--pushes", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "weight_sync.json"))
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    from lopd_ray.utils.runtime import apply_runtime_env

    apply_runtime_env()
    out = {"workers": args.workers, "engine": args.engine, "pushes": args.pushes, "models": {}}
    with tempfile.TemporaryDirectory(prefix="lopd_sync_models_") as scratch:
        for name in args.models.split(","):
            path = model_dir(name, scratch)
            print(f"{name}: {parameters(path) / 1e6:.2f}M parameters", flush=True)
            out["models"][name] = {"parameters": parameters(path), **measure(path, args.methods.split(","),
                                                                             args.workers, args.engine, args.pushes)}
            methods = out["models"][name]["methods"]
            if {"object_store", "collective"} <= set(methods):
                speedup = methods["collective"]["gb_per_s"] / methods["object_store"]["gb_per_s"]
                out["models"][name]["collective_speedup"] = speedup
                print(f"  collective / object_store throughput: {speedup:.2f}x", flush=True)
    results_file.write(args.out, out)


if __name__ == "__main__":
    main()
