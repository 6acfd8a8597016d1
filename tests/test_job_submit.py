"""The demo recipe through `ray job submit` against the head node started by cluster/start_head.sh."""
from __future__ import annotations

import os
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


def test_the_head_is_sized_with_every_cpu_even_under_the_projects_one_thread_setting():
    """`cluster/start_head.sh` without a CPU count offers Ray all the machine's CPUs, also when OMP_NUM_THREADS=1
    (which `nproc` alone obeys) is set, as the Makefile and the project's processes do."""
    script = f"source {os.path.join(REPO, 'cluster', 'env.sh')}; machine_cpus"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) == len(os.sched_getaffinity(0))
