"""LOPD with every actor live: a run killed with SIGKILL mid-way resumes with `run.resume=auto` from its last
complete checkpoint, and a restore brings back the student, the composer, both optimizers, beta and the bank exactly
(into the live actors, over an older checkpoint's state). A bank actor killed mid-run is replaced with every entry it
held (its last snapshot and the entries added since); a teacher rank killed takes its group down, and the next
teacher call is answered by a rebuilt group holding the last checkpoint's teacher state."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import ray
import torch

from conftest import head_address, kill
from lopd_ray.config import load_config
from lopd_ray.controller import Controller
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.utils.checkpoint import damage
from lopd_ray.utils.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml")
QUERIES = ["Reply with the letter 'a' repeated 5 times.", "Reply with the letter 'b' repeated 7 times."]
pytestmark = pytest.mark.ray
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def optimizer_moments(actor) -> list[torch.Tensor]:
    """Runs inside a learner or teacher actor: Adam's first moments of its DeepSpeed engine."""
    optimizer = actor.engine.optimizer
    base = getattr(optimizer, "optimizer", optimizer)
    return [state["exp_avg"].clone() for state in base.state.values()]


def phi_state(teacher) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in teacher.composer.phi_state_dict().items()}


def snapshot(controller: Controller) -> dict:
    teacher, learner = controller.teachers[0], controller.learners[0]
    exports = ray.get([l.export_weights.remote() for l in controller.learners])
    found = controller.bank.first("retrieve", QUERIES, 2, [None, None])
    return {"beta": controller.algorithm.beta, "phi": ray.get(teacher.__ray_call__.remote(phi_state)),
            "composer_moments": ray.get(teacher.__ray_call__.remote(optimizer_moments)),
            "student_moments": ray.get(learner.__ray_call__.remote(optimizer_moments)),
            "student": exports[0]["checksums"], "bank_size": controller.bank.first("size"),
            "retrieved": [[e.entry_id for e in entries] for entries in found]}


def bank_entry_ids(controller: Controller) -> list[str]:
    return sorted(controller.bank.first("__ray_call__", lambda bank: [e.entry_id for e in bank.entries]))


def success(text: str) -> Trajectory:
    return Trajectory(task_id=f"letters/train/{text}", group_id=0, prompt_ids=[1], response_ids=[5, 6],
                      loss_mask=[1, 1], turn_spans=[(0, 2)], rollout_logprobs=[0.0, 0.0], policy_version=9,
                      reward=1.0, task_text=text, action_texts=[text * 3], observation_texts=[])


def kill_the_bank_and_lose_nothing(controller: Controller) -> None:
    """Killed after an add (kept since the snapshot): the replacement restores the snapshot and replays what was
    added since, and the call that found the bank dead is answered."""
    controller.bank_add([success("x")])
    held = bank_entry_ids(controller)
    kill(controller.bank[0])
    stats = controller.bank_add([success("y")])
    after_one = bank_entry_ids(controller)
    assert stats["bank/restarts"] == 1 and stats["bank/size"] == len(after_one) == len(held) + 1
    assert set(held) < set(after_one)  # the snapshot, "x" added since, and "y"
    found = controller.bank.first("retrieve", QUERIES, 2, [None, None])
    assert all(len(entries) == 2 for entries in found)


def saved_step(latest: str) -> int:
    try:
        with open(latest) as f:
            return json.load(f)["step"]
    except FileNotFoundError:
        return 0


def run_and_kill(overrides: list[str], log_path, latest: str, checkpoints: int) -> int:
    """`python -m lopd_ray.train` on the test cluster, SIGKILLed once `checkpoints` checkpoints are complete;
    returns the step of the last complete one."""
    address = f"ray.address={head_address()}"
    with open(log_path, "w") as log:
        run = subprocess.Popen([sys.executable, "-m", "lopd_ray.train", RECIPE, "train.total_steps=1000", address,
                                *overrides], stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 480
    try:
        while saved_step(latest) < checkpoints:
            assert run.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint in time:\n" + log_path.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        os.killpg(run.pid, signal.SIGKILL)  # the driver and anything it started; Ray then reaps its actors
        run.wait()
    return saved_step(latest)


def test_a_killed_lopd_run_resumes_and_a_resume_restores_everything(ray_cluster, tiny_model_dir, tmp_path):
    overrides = [f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path}", "run.progress_bar=false",
                 "run.loggers=[]", "rollout.num_workers=1", "learner.num_learners=1", "train.prompts_per_step=4",
                 "train.samples_per_prompt=2", "run.checkpoint_every_steps=1", "run.keep_checkpoints=1",
                 "composer.cold_start_steps=2", "algorithm.lopd.margin=10.0", "bank.success_threshold=0.3",
                 "run.export_student=false", "sync.probe_every=2",
                 "rollout.engine=hf"]  # the vLLM engine runs in test_training_e2e, test_lopd_learning, test_vllm_engine
    run_dir = load_config(RECIPE, overrides).run_dir
    latest = os.path.join(run_dir, "checkpoints", "latest")
    saved = run_and_kill(overrides, tmp_path / "killed_run.log", latest, checkpoints=2)
    assert os.path.isfile(os.path.join(os.path.dirname(latest), f"step_{saved}", "controller_state.pt"))
    roles = {name.rsplit("-", 1)[0] for name in os.listdir(os.path.join(run_dir, "logs"))}
    assert roles == {"driver", "PolicyLearner", "RolloutWorker", "LatentTeacherWorker", "ExperienceBank"}, roles

    cfg = load_config(RECIPE, [*overrides, f"train.total_steps={saved + 1}", "run.resume=auto",
                               "run.keep_checkpoints=2"])
    resumed = Controller(cfg)
    try:
        assert resumed.start_step == saved
        resumed.run()
        rows = read_metrics(run_dir)
        before, checkpoint = snapshot(resumed), resumed.last_checkpoint
        assert saved_step(latest) == saved + 1 and checkpoint.endswith(f"step_{saved + 1}")
        # The killed run's checkpoint, a step behind, moves every part of the state; the newer one brings it back.
        resumed.cfg.run.resume = os.path.join(os.path.dirname(checkpoint), f"step_{saved}")
        assert resumed.restore() == saved
        moved = snapshot(resumed)
        resumed.cfg.run.resume = checkpoint
        assert resumed.restore() == saved + 1
        after = snapshot(resumed)
        kill_the_bank_and_lose_nothing(resumed)
        kill(resumed.teachers[0])  # found dead by the next teacher call (a checkpoint's), which a rebuilt group answers
        written = resumed.save_checkpoint(saved + 5)
        assert resumed.teacher_group.restarts == 1 and damage(written) is None
        assert os.path.isfile(os.path.join(written, "teacher_state.pt"))
        rebuilt = snapshot(resumed)
    finally:
        resumed.shutdown()
    assert [row["step"] for row in rows] == list(range(saved + 1))  # each step once, whatever the kill cut short
    for key in ("lopd/kl", "lopd/delta", "lopd/beta", "lopd/margin_violation", "lopd/teacher_student_gap",
                "bank/size", "bank/hit_rate", "bank/retrieve_ms", "timing_s/context", "timing_s/score_teacher",
                "timing_s/update_composer", "teacher/restarts", "timing_s/wall"):
        assert all(key in row for row in rows), key
    # The probe after every 2nd sync and the last one
    assert [("sync/logprob_diff_max" in r) for r in rows] == [(r["step"] + 1) % 2 == 0 or r["step"] == saved for r in rows]
    assert before["beta"] > 0 and before["bank_size"] >= cfg.bank.seed_references

    assert moved["student"] != before["student"]
    assert not all(torch.equal(moved["phi"][k], before["phi"][k]) for k in before["phi"])
    assert rebuilt["beta"] == after["beta"]  # the rebuilt teacher holds the checkpoint's state
    assert len(rebuilt["composer_moments"]) == len(after["composer_moments"])
    assert all(torch.equal(a, b) for a, b in zip(rebuilt["composer_moments"], after["composer_moments"]))
    assert all(torch.equal(rebuilt["phi"][k], after["phi"][k]) for k in after["phi"])
    assert after["beta"] == before["beta"]
    assert after["student"] == before["student"]
    assert after["bank_size"] == before["bank_size"] and after["retrieved"] == before["retrieved"]
    assert sorted(after["phi"]) == sorted(before["phi"])
    assert all(torch.equal(after["phi"][k], before["phi"][k]) for k in before["phi"])
    for name in ("composer_moments", "student_moments"):
        assert len(after[name]) == len(before[name]) > 0
        assert all(torch.equal(a, b) for a, b in zip(after[name], before[name])), name
