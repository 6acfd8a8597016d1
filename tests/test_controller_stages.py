"""The controller's loop against in-process stand-ins of its actors (tests/fake_actors.py): each method's stages run in
the order the loop states, on the groups that own them, once a step; no Ray cluster."""
from __future__ import annotations

import json
import os
from itertools import groupby

import pytest

from conftest import REPO
from fake_actors import FakeBank, FakeLearner, FakeRolloutWorker, FakeTeacher, fake_group

from lopd_ray.config import load_config

ONE_STEP = {
    # train.mode=sync: sample, learn, push the weights, then what follows the step
    "grpo": [("RolloutWorker", "rollout"), ("PolicyLearner", "train_step_by_reference"),
             ("PolicyLearner", "export_weights"), ("RolloutWorker", "update_weights")],
    # LOPD: retrieval for the context, the teacher's score, the student's step, the composer's step begun beside the
    # weight sync, the step's successes into the bank
    "lopd": [("RolloutWorker", "rollout"), ("ExperienceBank", "retrieve"), ("TeacherWorker", "teacher_scores"),
             ("PolicyLearner", "train_step_by_reference"), ("TeacherWorker", "update_composer"),
             ("PolicyLearner", "export_weights"), ("RolloutWorker", "update_weights"), ("ExperienceBank", "add"),
             ("ExperienceBank", "stats")],
    # DualOPSD: after the student's step, the learners score the teacher's support and the teacher steps toward
    # the updated student
    "dualopsd": [("RolloutWorker", "rollout"), ("TeacherWorker", "teacher_scores"),
                 ("PolicyLearner", "train_step_by_reference"), ("PolicyLearner", "student_scores_at_support"),
                 ("TeacherWorker", "step_toward_student"), ("PolicyLearner", "export_weights"),
                 ("RolloutWorker", "update_weights")],
    # DOPD: the privileged student (the learners, with the teacher's prompts) scored after the teacher
    "dopd": [("RolloutWorker", "rollout"), ("TeacherWorker", "teacher_scores"), ("TeacherWorker", "teacher_prompts"),
             ("PolicyLearner", "student_scores"), ("PolicyLearner", "train_step_by_reference"),
             ("PolicyLearner", "export_weights"), ("RolloutWorker", "update_weights")],
    # USD: the teacher under its weaker reveal levels after its own score
    "usd": [("RolloutWorker", "rollout"), ("TeacherWorker", "teacher_scores"),
            ("TeacherWorker", "teacher_scores_at_levels"), ("PolicyLearner", "train_step_by_reference"),
            ("PolicyLearner", "export_weights"), ("RolloutWorker", "update_weights")],
}
RECIPES = {method: f"{method}_letters_cpu.yaml" for method in ONE_STEP}
EVAL = [("RolloutWorker", "evaluate_held_out")]
CHECKPOINT = {"grpo": [("PolicyLearner", "save_checkpoint")],
              "dopd": [("PolicyLearner", "save_checkpoint"), ("TeacherWorker", "save_checkpoint")],
              "usd": [("PolicyLearner", "save_checkpoint"), ("TeacherWorker", "save_checkpoint")],
              "dualopsd": [("PolicyLearner", "save_checkpoint"), ("TeacherWorker", "save_checkpoint")],
              "lopd": [("PolicyLearner", "save_checkpoint"), ("TeacherWorker", "save_checkpoint"),
                       ("ExperienceBank", "snapshot")]}


def run_with_fakes(monkeypatch, tmp_path, method: str, *overrides: str) -> tuple[list, object]:
    """A whole run of `method`'s letters recipe for 2 steps with fake actors: the journal of the calls the groups
    got (consecutive calls of one method on a group's members counted once) and the controller."""
    import lopd_ray.controller as controller_module

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = load_config(os.path.join(REPO, "recipes", RECIPES[method]),
                      [f"model.path={model}", f"run.output_dir={tmp_path / 'run'}", "train.total_steps=2",
                       "train.prompts_per_step=2", "train.samples_per_prompt=2", "run.rollouts_logged_per_step=0",
                       "run.progress_bar=false", "run.loggers=[]", "sync.probe_prompts=0", "eval.every_steps=1",
                       "eval.tasks=2", "eval.split=train", "run.checkpoint_every_steps=1", "composer.cold_start_steps=0",
                       "bank.seed_references=4", "run.export_student=false", "sync.method=object_store",
                       *overrides])
    journal: list = []
    monkeypatch.setattr(controller_module, "build_learners", lambda cfg, path, wait=True: fake_group(
        FakeLearner, cfg.learner.num_learners, journal, cfg))
    monkeypatch.setattr(controller_module, "build_rollout_workers", lambda cfg, path, wait=True, renew=None:
                        fake_group(FakeRolloutWorker, cfg.rollout.num_workers, journal, cfg, renew))
    monkeypatch.setattr(controller_module, "build_teachers", lambda cfg, path, wait=True, renew=None: fake_group(
        FakeTeacher, cfg.teacher.num_workers, journal, cfg, renew))
    monkeypatch.setattr(controller_module, "build_bank", lambda cfg, wait=True, renew=None: fake_group(
        FakeBank, 1, journal, cfg, renew))
    controller = controller_module.Controller(cfg)
    start = len(journal)
    controller.run()
    calls = [call for call in journal[start:] if call[1] != "__ray_ready__"]
    return [call for call, _ in groupby(calls)], controller


@pytest.mark.parametrize("method", sorted(ONE_STEP))
def test_each_step_runs_its_stages_in_order_on_their_groups(monkeypatch, tmp_path, method):
    journal, controller = run_with_fakes(monkeypatch, tmp_path, method)
    sync = [("PolicyLearner", "export_weights"), ("RolloutWorker", "update_weights")]
    # the weights of step 0 first, then the held-out score before any update; each step ends with its score on
    # the held-out split and its checkpoint
    expected = sync + EVAL + (ONE_STEP[method] + EVAL + CHECKPOINT[method]) * 2
    assert journal == expected
    rows = [json.loads(line) for line in open(os.path.join(controller.cfg.run_dir, "metrics.jsonl"))]
    assert [row["step"] for row in rows] == [0, 1]


@pytest.mark.parametrize("method", ["dopd", "usd"])
def test_a_scorers_signals_reach_what_the_algorithm_reads(monkeypatch, tmp_path, method):
    """The signals a method's scorers write are on its trajectories when it prepares them."""
    from lopd_ray.algorithms.distill import Distill

    prepared = []
    real_prepare = Distill.prepare
    monkeypatch.setattr(Distill, "prepare", lambda self, trajs: prepared.append(list(trajs)) or real_prepare(
        self, trajs))
    run_with_fakes(monkeypatch, tmp_path, method)
    signal = {"dopd": "privileged_logprobs", "usd": "teacher_level"}[method]
    scored = [t for trajs in prepared for t in trajs if t.teacher_logprobs is not None]
    assert scored and all(getattr(t, signal) is not None for t in scored)


def test_a_stage_left_out_or_moved_is_seen(monkeypatch, tmp_path):
    """The journal is what the loop does: a loop that skips the teacher's score, or learns before it, differs."""
    import lopd_ray.controller as controller_module

    monkeypatch.setattr(controller_module.TeacherGroup, "score", lambda self, trajs: None)
    journal, _ = run_with_fakes(monkeypatch, tmp_path, "lopd")
    assert ("TeacherWorker", "teacher_scores") not in journal
    assert journal[:len(ONE_STEP["lopd"])] != ONE_STEP["lopd"]


def test_the_controller_calls_groups_never_an_actor():
    """Every call from the loop goes through an ActorGroup (its deadline, its restart), none to a handle."""
    source = open(os.path.join(REPO, "lopd_ray", "controller.py")).read()
    assert "remote(" not in source and "ray.get(" not in source and "ray.wait(" not in source


def test_checkpoint_parts_wait_for_the_checkpoint_timeout(monkeypatch, tmp_path):
    """The actors' checkpoint parts are awaited for run.checkpoint_timeout_s, the run section's own deadline."""
    from lopd_ray.utils.actor_group import Pending

    waits: list[tuple[str, float]] = []
    real_wait = Pending.wait
    monkeypatch.setattr(Pending, "wait", lambda self, timeout_s=None: waits.append((self.method, timeout_s))
                        or real_wait(self, timeout_s))
    run_with_fakes(monkeypatch, tmp_path, "lopd", "run.checkpoint_timeout_s=123", "sync.timeout_s=77")
    assert {timeout for method, timeout in waits if method == "save_checkpoint"} == {123.0}
