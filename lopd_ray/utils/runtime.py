"""Process-level settings every lopd_ray process needs: offline hubs, Ray without token auth, one torch thread."""
from __future__ import annotations

import os

RUNTIME_ENV_VARS = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # Keep vLLM's engine core inside the rollout actor (no extra processes) and let the OS place its threads:
    # several engines share the cores with the learners.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
    # Quiet consoles (utils/logs.py): vLLM's records go through lopd_ray's handlers instead of its own, torch's C++
    # warnings and the Hub's download bars stay out of the way.
    "VLLM_CONFIGURE_LOGGING": "0",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


def apply_runtime_env() -> None:
    """Sets the variables in this process unless the user set them already."""
    for key, value in RUNTIME_ENV_VARS.items():
        os.environ.setdefault(key, value)


def runtime_env_vars() -> dict[str, str]:
    """The settings as this process has them (a user's own values win), for the actors."""
    return {k: os.environ.get(k, v) for k, v in RUNTIME_ENV_VARS.items()}


# What a Ray job's upload of its working folder leaves out: history, outputs, caches.
JOB_UPLOAD_EXCLUDES = [".git", ".cluster", "runs", "*.egg-info", "__pycache__", ".pytest_cache", "benchmarks/results"]


def job_runtime_env(working_dir: str = "") -> dict:
    """A Ray job's runtime_env: the settings, and the folder uploaded less JOB_UPLOAD_EXCLUDES."""
    return {**({"working_dir": working_dir} if working_dir else {}), "excludes": JOB_UPLOAD_EXCLUDES,
            "env_vars": runtime_env_vars()}


def single_thread_torch() -> None:
    import torch

    torch.set_num_threads(1)


if __name__ == "__main__":  # `eval "$(python -m lopd_ray.utils.runtime)"`: the settings for a shell (cluster/env.sh);
    import json  # with --job, a job's runtime_env as JSON (cluster/submit.sh)
    import shlex
    import sys

    if sys.argv[1:] == ["--job"]:
        print(json.dumps(job_runtime_env()))
    else:
        print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in runtime_env_vars().items()))
