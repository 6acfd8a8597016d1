"""Every CPU recipe trains a step on the shared local Ray cluster (the tiny model in place of the recipe's own, so
no model is built) and logs the terms its method should."""
from __future__ import annotations

import glob
import math
import os

import pytest
import ray
import torch

from conftest import kill
from lopd_ray.config import load_config
from lopd_ray.controller import Controller
from lopd_ray.preflight import check_registries, check_unread_keys
from lopd_ray.study.runner import eval_rows
from lopd_ray.teacher.weights import follow_rate
from lopd_ray.utils.metrics import read_metrics
from lopd_ray.utils.timing import StageTimer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_RECIPES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "recipes", "*_cpu.yaml")))

# Metrics each method must log at every step.
TERMS = {
    "grpo": ["actor/clipfrac", "grpo/trained_samples"],
    "dapo": ["actor/clipfrac", "rollout/refill_rounds", "grpo/overlong_penalty_mean"],
    "opsd": ["distill/student_kl", "distill/top1_gap", "context/missing", "distill/context_gain",
             "distill/teacher_own_gap", "distill/context_share", "distill/update_align_context",
             "distill/update_align_own"],
    "op2sd": ["distill/student_kl", "distill/top1_gap", "context/missing"],
    "sdft": ["distill/student_kl", "distill/top1_gap", "context/missing"],
    "sdpo": ["distill/no_context_samples", "context/missing"],
    "dualopsd": ["distill/student_kl", "teacher/step_divergence", "teacher/step_grad_norm"],
    "h2sd": ["distill/student_kl", "actor/pg_loss", "actor/clipfrac"],
    "skillsd": ["actor/pg_loss", "distill/sampled_loss", "skill/library_size", "skill/value_mean", "context/missing"],
    "usd": ["distill/student_kl", "usd/lambda", "usd/selected_share", "usd/difficulty", "usd/level_mean"],
    "dopd": ["distill/student_kl", "distill/privilege_gap_mean", "distill/privileged_token_share"],
    "opd": ["distill/student_kl", "distill/teacher_sampled_prob"],
    "lopd": ["distill/student_kl", "lopd/kl", "lopd/beta", "lopd/margin_violation", "bank/size"],
    "rwsd": ["distill/student_kl", "reward_weighted/weight_mean"],
    "stsd": ["distill/student_kl", "teacher/success_tokens", "teacher/step_grad_norm"],
}

# Start-up is most of a 2-step run: one actor per group, the HF engine (the engines and data-parallel groups
# have end-to-end tests of their own).
FAST = ["rollout.engine=hf", "rollout.num_workers=1", "learner.num_learners=1", "train.prompts_per_step=4"]

# SDFT's EMA teacher runs as a group of two ranks, which must both follow the student; USD's as two ranks that hold
# half its backbone each (teacher.zero_stage=3).
TEACHER_RANKS = {"sdft": 2, "usd": 2}
# The tiny model rarely succeeds in 2 steps: Skill-SD counts any group as a success, so skills are written at once.
# SDFT's teacher follows the student through the object store (the broadcast channel is the default; SDPO's
# teacher follows over it). GRPO's workers schedule turns continuously (rollout.turns). LOPD's teacher is watched
# on held-out tasks (eval.teacher: latents from the bank's entries for each task's text).
OVERRIDES = {"skillsd": ["context.skill.success_threshold=0.0"], "sdft": ["sync.method=object_store"],
             "usd": ["teacher.zero_stage=3"], "grpo": ["rollout.turns=continuous"],
             "lopd": ["eval.teacher=true", "eval.every_steps=1", "eval.split=train", "eval.tasks=2"]}

pytestmark = pytest.mark.ray


def test_every_cpu_recipe_has_its_terms_listed():
    assert {name.split("_")[0] for name in CPU_RECIPES} == set(TERMS)


@pytest.mark.parametrize("recipe", CPU_RECIPES)
def test_cpu_recipe_trains_a_step_and_logs_its_terms(recipe, ray_cluster, tiny_model_dir, tmp_path):
    method = recipe.split("_")[0]
    cfg = load_config(os.path.join(REPO, "recipes", recipe),
                      [f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path}", "train.total_steps=1",
                       "run.checkpoint_every_steps=0", "run.export_student=false", "run.progress_bar=false",
                       "run.loggers=[]", "sync.probe_prompts=0", *FAST, *OVERRIDES.get(method, [])])
    cfg.teacher.num_workers = TEACHER_RANKS.get(method, 1)
    if cfg.teacher.model_path:  # a built model of the same family, instead of building the recipe's teacher
        cfg.teacher.model_path = tiny_model_dir
    if cfg.context.name == "latent" and cfg.algorithm.name != "grpo":
        cfg.composer.cold_start_steps = min(cfg.composer.cold_start_steps, 2)
    check_registries(cfg)
    check_unread_keys(cfg)
    controller = Controller(cfg)
    try:
        controller.run()
        if method == "sdpo":  # a following teacher found dead by the weight sync: it is rebuilt and follows
            kill(controller.teachers[0])
            controller.sync_weights(cfg.train.total_steps, StageTimer())
            assert controller.teacher_group.restarts == 1
        followed = ray.get([t.__ray_call__.remote(lambda self: self.followed_version) for t in controller.teachers])
        backbones = ray.get([t.__ray_call__.remote(lambda self: {n: p.detach().clone() for n, p in
                                                                   self._backbone_parameters().items()})
                             for t in controller.teachers])
    finally:
        controller.shutdown()
    rows = read_metrics(cfg.run_dir)
    assert [row["step"] for row in rows] == [0]
    for row in rows:
        for key in TERMS[method] + ["rollout/reward_mean"]:
            assert key in row and math.isfinite(row[key]), (key, row)
    if cfg.eval.teacher:  # each held-out evaluation scored the teacher too, on every task (each retrieved entries)
        held_out = eval_rows(cfg.run_dir)
        assert [r["updates"] for r in held_out] == [0, 1] and all(r["teacher_tasks"] == 2 for r in held_out)
        assert all(0.0 <= r["teacher_reward_mean"] <= 1.0 for r in held_out)
        assert all(0.0 <= row["eval/teacher_reward_mean"] <= 1.0 for row in rows)
    if method == "dopd":  # the teacher here is the student's own model: the privileged student scores as it does
        assert abs(rows[0]["distill/privilege_gap_mean"]) < 1e-4
    if follow_rate(cfg.teacher) is not None:  # every teacher rank took the student's last sync
        assert followed == [cfg.train.total_steps] * len(controller.teachers)
        assert all(torch.equal(value, backbones[0][name]) for other in backbones[1:] for name, value in other.items())
