# Environment shared by the cluster scripts: every lopd_ray process's settings (lopd_ray/utils/runtime.py: Ray
# without token auth, which Ray 2.60 enables by default and `ray job submit` then fails; offline hubs; one torch
# thread), so that the node's workers carry them and actors start on pooled workers.
eval "$("${PYTHON:-python3}" -m lopd_ray.utils.runtime)"
export RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
export RAY_HEAD_PORT="${RAY_HEAD_PORT:-6380}"
export RAY_JOB_ADDRESS="http://127.0.0.1:${RAY_DASHBOARD_PORT}"

# The CPUs this machine gives us. `nproc` alone obeys OMP_NUM_THREADS, which the project sets to 1 for every process:
# a head sized with it would offer Ray 1 CPU.
machine_cpus() { env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc; }
