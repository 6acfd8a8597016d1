"""A LOPD run killed with SIGKILL mid-way resumes with `run.resume=auto` from its last complete checkpoint."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from lopd_ray.config import load_config
from lopd_ray.controller import Controller
from lopd_ray.utils.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml")
pytestmark = pytest.mark.ray


def saved_step(latest: str) -> int:
    try:
        with open(latest) as f:
            return json.load(f)["step"]
    except FileNotFoundError:
        return 0


def test_a_killed_lopd_run_resumes_from_its_last_checkpoint(ray_cluster, tiny_model_dir, tmp_path):
    overrides = [f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path}", "run.progress_bar=false",
                 "run.tensorboard=false", "rollout.num_workers=1", "train.prompts_per_step=4",
                 "train.samples_per_prompt=2", "run.checkpoint_every_steps=1", "run.keep_checkpoints=1",
                 "composer.cold_start_steps=2", "run.export_student=false",
                 "rollout.engine=hf"]  # the engines have tests of their own; this one is about the checkpoint
    address = f"ray.address=127.0.0.1:{os.environ.get('RAY_HEAD_PORT', '6380')}"
    log_path = tmp_path / "killed_run.log"
    with open(log_path, "w") as log:
        run = subprocess.Popen([sys.executable, "-m", "lopd_ray.train", RECIPE, "train.total_steps=1000", address,
                                *overrides], stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    run_dir = load_config(RECIPE, overrides).run_dir
    latest = os.path.join(run_dir, "checkpoints", "latest")
    deadline = time.monotonic() + 480
    try:
        while saved_step(latest) < 2:
            assert run.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "no second checkpoint in time:\n" + log_path.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        os.killpg(run.pid, signal.SIGKILL)  # the driver and anything it started; Ray then reaps its actors
        run.wait()
    saved = saved_step(latest)
    assert os.path.isfile(os.path.join(os.path.dirname(latest), f"step_{saved}", "controller_state.pt"))

    resumed = Controller(load_config(RECIPE, [*overrides, f"train.total_steps={saved + 1}", "run.resume=auto"]))
    try:
        assert resumed.start_step == saved
        resumed.run()
    finally:
        resumed.shutdown()
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == list(range(saved + 1))
    assert all(row["lopd/beta"] >= 0 and row["bank/size"] > 0 for row in rows)
    assert saved_step(latest) == saved + 1
