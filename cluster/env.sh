# Environment shared by the cluster scripts: Ray without token auth (Ray 2.60 enables it by default and then
# `ray job submit` fails), no usage stats, offline hubs.
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
export RAY_HEAD_PORT="${RAY_HEAD_PORT:-6380}"
export RAY_JOB_ADDRESS="http://127.0.0.1:${RAY_DASHBOARD_PORT}"

# The CPUs this machine gives us. `nproc` alone obeys OMP_NUM_THREADS, which the project sets to 1 for every process:
# a head sized with it would offer Ray 1 CPU.
machine_cpus() { env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc; }
