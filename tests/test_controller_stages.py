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
             ("PolicyLearner", "export_weights"), ("RolloutWorker", "update_weights"), ("ExperienceBank", "stats"),
             ("ExperienceBank", "add"), ("ExperienceBank", "size")],
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
    # USD: the teacher under its weaker reveal levels after its own score, then the student's own log-probs (its
    # divergence D compares the two at the distillation temperature)
    "usd": [("RolloutWorker", "rollout"), ("TeacherWorker", "teacher_scores"),
            ("TeacherWorker", "teacher_scores_at_levels"), ("PolicyLearner", "student_scores"),
            ("PolicyLearner", "train_step_by_reference"),
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


def run_with_fakes(monkeypatch, tmp_path, method: str, *overrides: str, watched: bool = False) -> tuple[list, object]:
    """A whole run of `method`'s letters recipe for 2 steps with fake actors (`watched`: as the train command runs
    it, its faults named): the journal of the calls the groups got (consecutive calls of one method on a group's
    members counted once) and the controller."""
    import shutil

    import lopd_ray.controller as controller_module
    from lopd_ray.models import resolve_model_path

    model = tmp_path / "model"  # the tokenizer renders LOPD's composer inputs; no weights are read
    shutil.copytree(resolve_model_path("builtin:tiny-qwen3"), model, ignore=shutil.ignore_patterns("*.safetensors"))
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
    controller.run_or_name_the_lost_actor() if watched else controller.run()
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


def test_a_static_bank_takes_no_entries_during_training(monkeypatch, tmp_path):
    journal, _ = run_with_fakes(monkeypatch, tmp_path, "lopd", "bank.static=true")
    assert ("ExperienceBank", "add") not in journal and ("ExperienceBank", "stats") in journal
    growing, _ = run_with_fakes(monkeypatch, tmp_path / "growing", "lopd")
    assert ("ExperienceBank", "add") in growing


def test_the_composer_does_not_step_after_a_student_step_with_a_non_finite_gradient_norm(monkeypatch, tmp_path):
    real_step = FakeLearner.train_step_by_reference

    def diverged(self, plan, norms):
        (metrics, signals), blob = real_step(self, plan, norms)
        return ({**metrics, "actor/grad_norm": float("nan")}, signals), blob

    diverged.two_objects = True
    monkeypatch.setattr(FakeLearner, "train_step_by_reference", diverged)
    journal, controller = run_with_fakes(monkeypatch, tmp_path, "lopd")
    assert ("TeacherWorker", "update_composer") not in journal
    rows = [json.loads(line) for line in open(os.path.join(controller.cfg.run_dir, "metrics.jsonl"))]
    assert [row["teacher/skipped_steps"] for row in rows] == [1.0, 2.0]


def test_the_teacher_watched_plays_beside_the_student_and_the_run_says_once_when_it_caught_up(monkeypatch, tmp_path,
                                                                                           caplog):
    """eval.teacher: each evaluation begins the teacher's greedy episodes of the held-out tasks (here under their own
    solution, DOPD's oracle context) before the student's; the row holds the teacher's mean and its tasks; one line
    says so the first time the teacher is within eval.teacher_margin of the student, and never again."""
    import logging

    from fake_actors import trajectory

    played = []
    teacher_rewards = iter([[1.0, 0.5], [0.25, 0.0], [0.0, 0.0]])  # the teacher's at updates 0, 1 and 2

    def play_held_out(self, probes):
        played.append([(t.task_index, t.teacher_context.text) for t in probes])
        return next(teacher_rewards)

    monkeypatch.setattr(FakeTeacher, "play_held_out", play_held_out)
    monkeypatch.setattr(FakeRolloutWorker, "evaluate_held_out",  # the student: 0.0 and 0.25 on the two tasks
                        lambda self, requests: [trajectory(r, self.version, 0.25 * r.task_index) for r in requests])
    caplog.set_level(logging.INFO, logger="lopd_ray")
    journal, controller = run_with_fakes(monkeypatch, tmp_path, "dopd", "eval.teacher=true", "eval.teacher_margin=0.1")
    eval_stage = [("TeacherWorker", "play_held_out"), ("RolloutWorker", "evaluate_held_out")]
    sync = [("PolicyLearner", "export_weights"), ("RolloutWorker", "update_weights")]
    assert journal == sync + eval_stage + (ONE_STEP["dopd"] + eval_stage + CHECKPOINT["dopd"]) * 2
    tasks = controller.held_out_tasks
    assert all([i for i, _ in probes] == [0, 1] for probes in played)
    assert all(tasks.reference_solution(i) in text for probes in played for i, text in probes)
    rows = [json.loads(line) for line in open(os.path.join(controller.cfg.run_dir, "eval.jsonl"))]
    assert [(r["teacher_reward_mean"], r["teacher_tasks"], r["reward_mean"]) for r in rows] == [
        (0.75, 2, 0.125), (0.125, 2, 0.125), (0.0, 2, 0.125)]
    metrics = [json.loads(line) for line in open(os.path.join(controller.cfg.run_dir, "metrics.jsonl"))]
    assert [m["eval/teacher_reward_mean"] for m in metrics] == [0.125, 0.0]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Teacher no better")]
    assert len(said) == 1 and "at update 1: held-out reward 0.125 against the student's 0.125" in said[0], said


@pytest.mark.parametrize("site", ["metrics row", "rollout dump", "student export"])
def test_a_full_disk_anywhere_the_run_writes_is_one_disk_full_error(site, monkeypatch, tmp_path):
    """The write fails as on a full disk (ENOSPC from the file system) at step 1 or at the export; the run ends with
    the one `disk full:` error naming the run's disk and where it stopped, every earlier row kept."""
    import errno

    import lopd_ray.controller as controller_module
    from lopd_ray.errors import DiskFullError
    from lopd_ray.utils.metrics import MetricsLogger, read_metrics

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    overrides = []
    if site == "metrics row":
        real = MetricsLogger.log
        monkeypatch.setattr(MetricsLogger, "log", lambda self, step, metrics: full(self.path) if step == 1
                            else real(self, step, metrics))
    elif site == "rollout dump":
        overrides = ["run.rollouts_logged_per_step=2"]
        monkeypatch.setattr(controller_module, "dump_rollouts", lambda run_dir, step, *rest: full(
            os.path.join(run_dir, "rollouts")) if step == 1 else None)
    else:
        overrides = ["run.export_student=true"]
        monkeypatch.setattr(controller_module, "write_student", lambda payload, model, out: full(out))
    with pytest.raises(DiskFullError) as caught:
        run_with_fakes(monkeypatch, tmp_path, "grpo", *overrides, watched=True)
    message = str(caught.value)
    run_dir = str(tmp_path / "run" / "grpo_letters_cpu")
    stage = "step 1, stage 'log'" if site != "student export" else "step 1, stage 'export'"
    assert message.startswith(f"no space left on the device of {run_dir} at {stage} (No space left"), message
    assert "checkpoint being written" not in message
    assert "(No space left on device)" in message and "free space there" in message
    assert [row["step"] for row in read_metrics(run_dir)] == ([0] if site == "metrics row" else [0, 1])
