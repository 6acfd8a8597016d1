"""The demo recipe through `ray job submit` against the head node started by cluster/start_head.sh."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess

import pytest

from lopd_ray.utils.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.ray


def test_recipe_runs_as_a_ray_job(ray_cluster, tiny_model_dir, tmp_path):
    proc = subprocess.run(
        [os.path.join(REPO, "cluster", "submit.sh"), "recipes/grpo_letters_cpu.yaml", "train.total_steps=2",
         f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path}", "run.progress_bar=false",
         "run.checkpoint_every_steps=0", "rollout.num_workers=1", "learner.num_learners=1", "sync.probe_every=1",
         "rollout.engine=hf"],  # the job is what is tested here; the engines and learner groups have tests of their own
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded" in proc.stdout + proc.stderr
    steps = read_metrics(os.path.join(tmp_path, "grpo_letters_cpu"))
    assert [m["step"] for m in steps] == [0, 1]
    assert all(m["sync/logprob_diff_max"] <= 1e-2 for m in steps)


@contextlib.contextmanager
def listening(*ports: int):
    """Sockets listening on `ports` (the ones free here), as another Ray cluster at Ray's defaults would."""
    held = []
    try:
        for port in ports:
            sock = socket.socket()
            with contextlib.suppress(OSError):
                sock.bind(("", port))
                sock.listen()
                held.append(sock)
        yield [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def newer_plain_head() -> tuple[subprocess.Popen, int]:
    """A Ray head started the plain way after ours (in Ray's shared temp dir, which then names it the machine's
    current cluster), on free ports, and its dashboard's port; killed with its process group."""
    import socket

    held = [socket.socket() for _ in range(4)]
    for sock in held:
        sock.bind(("", 0))
    ports = [sock.getsockname()[1] for sock in held]
    for sock in held:
        sock.close()
    return subprocess.Popen(["ray", "start", "--head", "--block", "--num-cpus=1", f"--port={ports[0]}",
                             f"--dashboard-port={ports[1]}", f"--dashboard-agent-listen-port={ports[2]}",
                             f"--ray-client-server-port={ports[3]}", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True), ports[1]


def test_a_head_of_its_own_beside_other_clusters_runs_the_job_and_stop_leaves_the_others(ray_cluster, tiny_model_dir,
                                                                                         tmp_path):
    """With Ray's default ports taken, the session's cluster running and a plain head started after ours,
    start_head.sh starts a head on free ports, submit.sh sends the job to it (whose driver joins it, not the newest
    cluster of the machine), and stop.sh stops it alone."""
    import signal
    import socket
    import time

    from conftest import recorded_head

    own = {**os.environ, "LOPD_RAY_CLUSTER_DIR": str(tmp_path / "own")}
    script = lambda name, *args, env=own: subprocess.run(  # noqa: E731
        [os.path.join(REPO, "cluster", name), *args], env=env, capture_output=True, text=True, timeout=600)
    with listening(8265, 6380) as taken:
        refused = script("start_head.sh", "2", env={**own, "RAY_HEAD_PORT": str(taken[-1])}) if taken else None
        started = script("start_head.sh", "2")
    assert refused is None or (refused.returncode == 2 and "unset RAY_HEAD_PORT" in refused.stderr), refused
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        head = recorded_head(own["LOPD_RAY_CLUSTER_DIR"])
        other = recorded_head(os.environ["LOPD_RAY_CLUSTER_DIR"])
        assert head["HEAD_PORT"] not in ("6380", other["HEAD_PORT"]) and not head["JOB_ADDRESS"].endswith(":8265")
        started = time.time()
        newer, dashboard = newer_plain_head()
        while True:  # up (its dashboard, the last to start, answers), and the machine's current cluster
            try:
                socket.create_connection(("127.0.0.1", dashboard), timeout=1).close()
                break
            except OSError:
                assert time.time() < started + 90 and newer.poll() is None, "the plain head did not start"
                time.sleep(0.5)
        job = script("submit.sh", "recipes/grpo_letters_cpu.yaml", "train.total_steps=1", f"model.path={tiny_model_dir}",
                     f"run.output_dir={tmp_path}", "run.progress_bar=false", "run.checkpoint_every_steps=0",
                     "rollout.num_workers=1", "learner.num_learners=1", "rollout.engine=hf")
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert [m["step"] for m in read_metrics(str(tmp_path / "grpo_letters_cpu"))] == [0]
    finally:
        stopped = script("stop.sh")
        if "newer" in locals():
            os.killpg(newer.pid, signal.SIGTERM)
            try:
                newer.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(newer.pid, signal.SIGKILL)
    assert stopped.returncode == 0 and "Stopped the Ray head" in stopped.stdout, stopped
    assert os.path.exists(f"/proc/{other['HEAD_PID']}") and ray_cluster.cluster_resources().get("CPU", 0) > 0
    assert not os.path.exists(os.path.join(own["LOPD_RAY_CLUSTER_DIR"], "head.env"))


def test_the_head_is_sized_with_every_cpu_even_under_the_projects_one_thread_setting():
    """`cluster/start_head.sh` without a CPU count offers Ray all the machine's CPUs, also when OMP_NUM_THREADS=1
    (which `nproc` alone obeys) is set, as the Makefile and the project's processes do."""
    script = f"source {os.path.join(REPO, 'cluster', 'env.sh')}; machine_cpus"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) == len(os.sched_getaffinity(0))
