"""A run that stops learning says so: run.max_idle_updates steps in a row without an update end it in one line
naming the cause, and the run's summary counts the steps that made none."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lopd_ray.errors import NotLearningError
from lopd_ray.idle_updates import IdleUpdates, made_update

REPO = Path(__file__).resolve().parent.parent
UPDATE = {"actor/skipped_update": 0.0, "actor/grad_norm": 0.7}
FLAT = {"actor/skipped_update": 1.0, "grpo/groups": 8.0, "grpo/zero_variance_groups": 8.0}
NO_CONTEXT = {"actor/skipped_update": 1.0, "distill/no_context_samples": 32.0}
NAN = {"actor/skipped_update": 0.0, "actor/grad_norm": math.nan}
ZERO = {"actor/skipped_update": 0.0, "actor/grad_norm": 0.0}


def test_an_update_is_a_step_whose_gradient_moved_the_weights():
    assert made_update(UPDATE)
    assert not any(made_update(m) for m in (FLAT, NO_CONTEXT, NAN, ZERO))


@pytest.mark.parametrize("metrics,cause", [
    (FLAT, "grpo/zero_variance_groups 8 of 8"), (NO_CONTEXT, "distill/no_context_samples 32 of 32"),
    (NAN, "the gradient norm was nan"), (ZERO, "the gradient was 0"),
    ({"actor/skipped_update": 1.0}, "kept no sample")])
def test_the_limit_of_steps_in_a_row_ends_the_run_naming_the_cause(metrics, cause):
    idle = IdleUpdates(limit=3)
    for step, m in enumerate([metrics, metrics, UPDATE, metrics, metrics]):  # an update starts the count again
        idle.observe(step, m, samples=32)
    with pytest.raises(NotLearningError) as error:
        idle.observe(5, metrics, samples=32)
    assert cause in str(error.value) and "steps 3-5" in str(error.value) and "run.max_idle_updates=3" in str(error.value)
    assert idle.made == 1


def test_a_limit_of_0_never_stops():
    idle = IdleUpdates(limit=0)
    for step in range(50):
        idle.observe(step, FLAT, samples=32)
    assert idle.idle == 50


@pytest.mark.slow
def test_grpo_from_a_model_that_never_succeeds_stops_in_one_last_line(tmp_path):
    """The untrained tiny model on the exact-match rules env: every group all 0, every update skipped."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS="")
    args = ["recipes/grpo_letters_cpu.yaml", "env.name=rules", "model.path=builtin:tiny-qwen3", "train.total_steps=10",
            "run.max_idle_updates=3", f"run.output_dir={tmp_path}", "run.name=never", "run.loggers=[]",
            "rollout.num_workers=1", "rollout.engine=hf", "learner.num_learners=1", "run.checkpoint_every_steps=0",
            "run.export_student=false"]
    log = tmp_path / "console.txt"
    with open(log, "w") as out:  # redirected to a file, as a user's `> log 2>&1`
        proc = subprocess.run([sys.executable, "-m", "lopd_ray.train", *args], cwd=REPO, env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=900)
    text = log.read_text()
    assert proc.returncode == 1, text[-3000:]
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert last.startswith("not learning: no update in 3 steps in a row (steps 0-2;"), text[-3000:]
    assert "grpo/zero_variance_groups 8 of 8" in last
    rows = [json.loads(line) for line in (tmp_path / "never" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and all(r["actor/skipped_update"] == 1.0 for r in rows)
