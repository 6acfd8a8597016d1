#!/usr/bin/env bash
# Submits a training run as a Ray job to the head cluster/start_head.sh started (recorded in
# $LOPD_RAY_CLUSTER_DIR/head.env), or to the job API RAY_JOB_ADDRESS names (http://HOST:PORT), uploading this
# checkout without the heavy folders.
# Usage: cluster/submit.sh RECIPE.yaml [key=value ...]
# The run's outputs go to this checkout's runs/ (an absolute path, so they outlive the job's temporary working
# directory); a run.output_dir=... argument overrides it.
set -euo pipefail
usage() { sed -n '2,7s/^# \{0,1\}//p' "$0"; }
if [ $# -eq 0 ]; then usage >&2; exit 2; fi
if [ "$1" = "--help" ] || [ "$1" = "-h" ]; then usage; exit 0; fi
source "$(dirname "$0")/env.sh"
cd "$(dirname "$0")/.."
if [ -z "${RAY_JOB_ADDRESS:-}" ]; then
  if [ ! -f "$CLUSTER_FILE" ]; then
    echo "cluster/submit.sh: no Ray head recorded in $CLUSTER_FILE: start one with cluster/start_head.sh, or set" \
      "RAY_JOB_ADDRESS=http://HOST:PORT to submit to another cluster's job API" >&2
    exit 2
  fi
  source "$CLUSTER_FILE"
  if ! head_alive; then
    echo "cluster/submit.sh: the Ray head recorded in $CLUSTER_FILE (process $HEAD_PID) is not running: start a new" \
      "one with cluster/start_head.sh" >&2
    exit 2
  fi
  RAY_JOB_ADDRESS="$JOB_ADDRESS"
fi
exec ray job submit --address "$RAY_JOB_ADDRESS" --working-dir . \
  --runtime-env-json "$("${PYTHON:-python3}" -m lopd_ray.utils.runtime --job)" \
  -- python -m lopd_ray.train "$1" "run.output_dir=$PWD/runs" "${@:2}"
