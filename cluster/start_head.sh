#!/usr/bin/env bash
# Starts a Ray head node on this machine (the dashboard serves the job API). Usage: cluster/start_head.sh [NUM_CPUS]
set -euo pipefail
source "$(dirname "$0")/env.sh"
ray start --head --port="$RAY_HEAD_PORT" --num-cpus="${1:-$(machine_cpus)}" --dashboard-host=127.0.0.1 \
  --dashboard-port="$RAY_DASHBOARD_PORT" --disable-usage-stats
# The job API comes up a few seconds after `ray start` returns.
for _ in $(seq 60); do
  ray job list --address "$RAY_JOB_ADDRESS" >/dev/null 2>&1 && exit 0
  sleep 1
done
echo "the Ray job API at $RAY_JOB_ADDRESS did not answer within 60 s" >&2
exit 1
