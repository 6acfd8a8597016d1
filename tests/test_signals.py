"""The per-token signals and their scorers are declarations the rest follows: every scorer a recipe's algorithm
names exists, writes declared signals and is a two-object method of the actor kind it names; what the driver ships
to each actor is what the declarations say it reads."""
from __future__ import annotations

import glob
import os

import pytest

from conftest import REPO

from lopd_ray.algorithms import make_algorithm
from lopd_ray.config import load_config
from lopd_ray.data.batching import LEARNER_READS
from lopd_ray.data.signals import BY_REFERENCE, LEARNER, SCORERS, SIGNALS, TEACHER, writes_of
from lopd_ray.learner.policy_learner import PolicyLearner
from lopd_ray.teacher.group import TEACHER_READS
from lopd_ray.teacher.latent_worker import LatentTeacherWorker
from lopd_ray.teacher.worker import TeacherWorker

ACTOR_CLASSES = {LEARNER: [PolicyLearner], TEACHER: [TeacherWorker, LatentTeacherWorker]}
RECIPES = sorted(glob.glob(os.path.join(REPO, "recipes", "*.yaml")))


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_each_scorer_is_a_two_object_method_of_its_actor_writing_declared_signals(name):
    scorer = SCORERS[name]
    assert set(scorer.writes) <= set(SIGNALS), f"{name} writes undeclared signals"
    for cls in ACTOR_CLASSES[scorer.actor]:
        method = getattr(cls, scorer.method, None)
        assert method is not None, f"{cls.__name__} has no {scorer.method} for the scorer {name}"
        assert getattr(method, "__ray_num_returns__", 1) == 2, f"{cls.__name__}.{scorer.method} must return two"


@pytest.mark.parametrize("recipe", RECIPES, ids=os.path.basename)
def test_every_recipe_names_known_scorers_that_write_what_its_loss_needs(recipe):
    algo = make_algorithm(load_config(recipe).algorithm)
    assert set(algo.scorers()) <= set(SCORERS)
    if algo.needs_teacher:  # every distillation needs the teacher's sampled-token log-probs and a support
        assert {"teacher_logprobs", "teacher_topm_ids", "teacher_topm_logprobs"} <= writes_of(algo.scorers())
    else:
        assert algo.scorers() == ()


def test_each_switch_changes_the_scorers_it_needs():
    plain = ["algorithm.distill.support=teacher_topm", "algorithm.distill.diagnose_context=false",
             "algorithm.distill.route=all"]

    def scorers(*overrides):
        return make_algorithm(load_config(os.path.join(REPO, "recipes", "opsd_letters_cpu.yaml"),
                                          plain + list(overrides)).algorithm).scorers()
    assert scorers() == ("teacher",)
    assert scorers("algorithm.distill.support=student_topk") == ("student_support", "teacher")
    assert scorers("algorithm.distill.support=full_vocab") == ("teacher_full_vocab",)
    assert scorers("algorithm.distill.diagnose_context=true") == ("teacher", "teacher_without_context")
    assert scorers("algorithm.distill.route=privilege_gap") == ("teacher", "privileged_student")


def test_what_travels_and_what_is_shipped_follow_the_declarations():
    assert set(BY_REFERENCE) == {name for name, s in SIGNALS.items() if s.by_reference}
    assert not set(BY_REFERENCE) & (set(LEARNER_READS) | set(TEACHER_READS))  # the wide ones are fetched
    assert {"advantages", "teacher_logprobs", "distill_weights", "teacher_level"} <= set(LEARNER_READS)
    assert "student_logprobs" in TEACHER_READS and "student_logprobs" not in LEARNER_READS
