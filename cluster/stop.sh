#!/usr/bin/env bash
# Stops the Ray head cluster/start_head.sh started (recorded in $LOPD_RAY_CLUSTER_DIR/head.env) and every process of
# its node; other Ray clusters on this machine keep running.
set -euo pipefail
source "$(dirname "$0")/env.sh"
if [ ! -f "$CLUSTER_FILE" ]; then
  echo "No Ray head recorded in $CLUSTER_FILE (cluster/start_head.sh records the one it starts): nothing stopped."
  exit 0
fi
source "$CLUSTER_FILE"
if head_alive; then
  kill -TERM "$HEAD_PID"  # `ray start --block` stops its node's processes, then exits
  for _ in $(seq 30); do
    head_alive || break
    sleep 1
  done
  if head_alive; then
    kill -KILL "$HEAD_PID"  # its processes share its fate (they die with it)
  fi
  echo "Stopped the Ray head at $HEAD_ADDRESS (process $HEAD_PID)."
else
  echo "The Ray head recorded in $CLUSTER_FILE (process $HEAD_PID) was not running; its record is removed."
fi
rm -f "$CLUSTER_FILE"
