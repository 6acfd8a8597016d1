#!/usr/bin/env bash
# Submits a training run to the cluster as a Ray job, uploading this checkout without the heavy folders.
# Usage: cluster/submit.sh RECIPE.yaml [key=value ...]
# The run's outputs go to this checkout's runs/ (an absolute path, so they outlive the job's temporary working
# directory); a run.output_dir=... argument overrides it.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$(dirname "$0")/.."
exec ray job submit --address "$RAY_JOB_ADDRESS" --working-dir . \
  --runtime-env-json '{"excludes": [".git", "runs", "*.egg-info", "__pycache__", ".pytest_cache", "benchmarks/results"], "env_vars": {"RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}}' \
  -- python -m lopd_ray.train "$1" "run.output_dir=$PWD/runs" "${@:2}"
