#!/usr/bin/env bash
# Starts a Ray head node on this machine (the dashboard serves the job API) on free ports, or on RAY_HEAD_PORT and
# RAY_DASHBOARD_PORT where they are set (refused when taken), and records it in $LOPD_RAY_CLUSTER_DIR/head.env for
# cluster/submit.sh and cluster/stop.sh. Another Ray cluster on this machine is left alone.
# Usage: cluster/start_head.sh [NUM_CPUS]
set -euo pipefail
source "$(dirname "$0")/env.sh"

if [ -f "$CLUSTER_FILE" ]; then
  source "$CLUSTER_FILE"
  if head_alive; then
    echo "cluster/start_head.sh: the head recorded in $CLUSTER_FILE is running (job API $JOB_ADDRESS): stop it with" \
      "cluster/stop.sh, or set LOPD_RAY_CLUSTER_DIR to another folder to start a second one" >&2
    exit 2
  fi
fi
# The head's two ports, and two more that Ray otherwise takes at fixed numbers (its client server, 10001, and its
# dashboard agent, 52365), which a second cluster on the machine would find taken.
read -r head_port dashboard_port client_port agent_port <<<"$(free_ports 4)"
for key in RAY_HEAD_PORT RAY_DASHBOARD_PORT; do
  if [ -n "${!key:-}" ] && ! port_free "${!key}"; then
    echo "cluster/start_head.sh: port ${!key} ($key) is taken on this machine: unset $key to take a free port," \
      "or give another" >&2
    exit 2
  fi
done
head_port="${RAY_HEAD_PORT:-$head_port}" dashboard_port="${RAY_DASHBOARD_PORT:-$dashboard_port}"

mkdir -p "$LOPD_RAY_CLUSTER_DIR"
# In a session of its own, so that the terminal's signals do not reach it; cluster/stop.sh ends it and, with it,
# every process of the node (`--block`: the command holds them and takes them down when it is stopped). Its own
# temp dir: Ray's job API starts a job's driver on the cluster that the temp dir's `ray_current_cluster` names, which
# in the shared /tmp/ray is whichever cluster on the machine started last (the job then fails to fetch its files).
setsid ray start --head --block --port="$head_port" --num-cpus="${1:-$(machine_cpus)}" --dashboard-host=127.0.0.1 \
  --dashboard-port="$dashboard_port" --ray-client-server-port="$client_port" \
  --dashboard-agent-listen-port="$agent_port" --temp-dir="/tmp/ray-lopd-$head_port" --disable-usage-stats \
  >"$LOPD_RAY_CLUSTER_DIR/head.log" 2>&1 &
HEAD_PID=$! HEAD_PORT=$head_port HEAD_ADDRESS="127.0.0.1:$head_port" JOB_ADDRESS="http://127.0.0.1:$dashboard_port"
printf 'HEAD_PID=%s\nHEAD_PORT=%s\nHEAD_ADDRESS=%s\nJOB_ADDRESS=%s\n' "$HEAD_PID" "$HEAD_PORT" "$HEAD_ADDRESS" \
  "$JOB_ADDRESS" >"$CLUSTER_FILE"

# The job API comes up some seconds after the head.
for _ in $(seq 60); do
  if ! kill -0 "$HEAD_PID" 2>/dev/null; then
    rm -f "$CLUSTER_FILE"
    echo "cluster/start_head.sh: the Ray head exited while starting; its output: $LOPD_RAY_CLUSTER_DIR/head.log" >&2
    exit 1
  fi
  if ray job list --address "$JOB_ADDRESS" >/dev/null 2>&1; then
    echo "Ray head started: job API $JOB_ADDRESS, cluster address $HEAD_ADDRESS (ray.address=$HEAD_ADDRESS joins" \
      "it); recorded in $CLUSTER_FILE; cluster/stop.sh stops it."
    exit 0
  fi
  sleep 1
done
echo "cluster/start_head.sh: the Ray job API at $JOB_ADDRESS did not answer within 60 tries (the head keeps" \
  "running: cluster/stop.sh stops it; its output: $LOPD_RAY_CLUSTER_DIR/head.log)" >&2
exit 1
