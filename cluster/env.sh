# Environment shared by the cluster scripts: every lopd_ray process's settings (lopd_ray/utils/runtime.py: Ray
# without token auth, which Ray 2.60 enables by default and `ray job submit` then fails; offline hubs; one torch
# thread), so that the node's workers carry them and actors start on pooled workers.
eval "$("${PYTHON:-python3}" -m lopd_ray.utils.runtime)"

# Where cluster/start_head.sh records the head it started (head.env: its process and addresses), which
# cluster/submit.sh submits to and cluster/stop.sh stops. One head per folder: another folder starts a second one.
export LOPD_RAY_CLUSTER_DIR="${LOPD_RAY_CLUSTER_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.cluster}"
CLUSTER_FILE="$LOPD_RAY_CLUSTER_DIR/head.env"

# The head's ports where the launcher owns its nodes (cluster/ray_up.yaml, cluster/slurm.sbatch): fixed, so that the
# workers and an SSH tunnel know them in advance. cluster/start_head.sh picks free ones instead.
dedicated_ports() { export RAY_HEAD_PORT="${RAY_HEAD_PORT:-6380}" RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"; }

# The CPUs this machine gives us. `nproc` alone obeys OMP_NUM_THREADS, which the project sets to 1 for every process:
# a head sized with it would offer Ray 1 CPU.
machine_cpus() { env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc; }

# N distinct free TCP ports of this machine: the kernel's picks, held together so that they differ.
free_ports() {
  "${PYTHON:-python3}" -c 'import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held:
    s.bind(("", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))' "$1"
}

# Whether nothing listens on TCP port $1 here.
port_free() { "${PYTHON:-python3}" -c 'import socket, sys; socket.socket().bind(("", int(sys.argv[1])))' "$1" 2>/dev/null; }

# Whether the head recorded in $CLUSTER_FILE (sourced: HEAD_PID, HEAD_PORT) is still that `ray start` process.
head_alive() {
  local args  # read whole (-ww: COLUMNS does not cut it); under pipefail `ps | grep -q` could fail on SIGPIPE
  [ -n "${HEAD_PID:-}" ] && kill -0 "$HEAD_PID" 2>/dev/null && args="$(ps -ww -o args= -p "$HEAD_PID")" \
    && [[ "$args" == *"ray start --head --block --port=$HEAD_PORT "* ]]
}
