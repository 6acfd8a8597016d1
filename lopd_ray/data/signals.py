"""The per-token signals a trajectory gathers after its rollout, and the scorers that make them.

A signal is a per-token array some stage writes and later stages read; the declaration says its dtype and shape,
whether it travels by reference (the wide ones: only actors hold them, data/by_reference.py) and which actors
read it from what the driver sends. The Trajectory's signal fields, the by-reference list and what the driver ships
to learners and teachers all follow from SIGNALS.

A scorer is a stage of the teacher's scoring: an actor kind's method that makes some signals for the trajectories
it applies to. An algorithm names the scorers it runs, in order (`Algorithm.scorers`); TeacherGroup runs them. Every
scorer method answers through `ship`: {uid: {signal: array}} for what the driver holds, and the blob of the rest.

Shapes are in R (response tokens), M (support size, teacher.top_m), L (context levels) and d (hidden size)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

LEARNER, TEACHER = "learner", "teacher"


@dataclass(frozen=True)
class Signal:
    dtype: type
    shape: str
    doc: str
    by_reference: bool = False       # the driver sees None; actors fetch it from the blob that holds it
    read_by: tuple[str, ...] = ()     # the actor kinds that read it from what the driver sends


SIGNALS: dict[str, Signal] = {
    # written by the algorithm on the controller (`Algorithm.prepare`)
    "advantages": Signal(np.float32, "R", "the RL term's per-token advantage", read_by=(LEARNER,)),
    "distill_weights": Signal(np.float32, "R", "the distillation term's per-token weight (None: the loss mask)",
                              read_by=(LEARNER,)),
    "teacher_level": Signal(np.int64, "R", "the context level whose targets each token takes (USD)",
                            read_by=(LEARNER,)),
    # written by the scorers below
    "support_ids": Signal(np.int64, "R, M", "the student's top-M, where it is the support", by_reference=True),
    "teacher_topm_ids": Signal(np.int64, "R, M", "the support: the teacher's top-M, or support_ids",
                               by_reference=True),
    "teacher_topm_logprobs": Signal(np.float32, "R, M", "the teacher's log-probs on the support", by_reference=True),
    "teacher_hidden": Signal(np.float32, "R, d", "the teacher's last hidden states (full-vocabulary loss)",
                             by_reference=True),
    "teacher_logprobs": Signal(np.float32, "R", "the teacher's log-prob of each sampled token", read_by=(LEARNER,)),
    "teacher_entropy": Signal(np.float32, "R", "the entropy of the teacher's top-M + tail distribution"),
    "teacher_plain_logprobs": Signal(np.float32, "R", "the teacher's log-prob of each sampled token with an empty "
                                                      "context (diagnostics)"),
    "privileged_logprobs": Signal(np.float32, "R", "the student's log-prob of each sampled token with the "
                                                   "teacher's prompt (DOPD)"),
    "level_logprobs": Signal(np.float32, "L - 1, R", "the teacher's log-prob of each sampled token under each "
                                                     "weaker context level (the strongest: teacher_logprobs)"),
    "level_entropy": Signal(np.float32, "L - 1, R", "the entropy of its top-M under each weaker level"),
    "level_topm_ids": Signal(np.int64, "L - 1, R, M", "the support under each weaker level", by_reference=True),
    "level_topm_logprobs": Signal(np.float32, "L - 1, R, M", "its log-probs there", by_reference=True),
    "own_logprobs": Signal(np.float32, "R", "the student's log-prob of each sampled token at the distillation "
                                           "temperature, before the update: what a sampled-token gap compares the "
                                           "teacher with (the engine's log-probs carry the sampling settings)"),
    # written by the learners in the training step (pre-update) and for the teacher's own step (updated)
    "student_logprobs": Signal(np.float32, "R", "the student's log-prob of each sampled token", read_by=(TEACHER,)),
    "student_topm_logprobs": Signal(np.float32, "R, M", "the student's log-probs on the support", by_reference=True),
}

# Which trajectories a scorer is sent. The teacher's own scorers take the whole batch (they skip a trajectory without
# a context themselves) so that each rank scores the shard its composer step then gets.
APPLIES_TO: dict[str, Callable] = {
    "all": lambda t: True,
    "with_context": lambda t: t.teacher_context is not None,
    "scored": lambda t: t.teacher_logprobs is not None,
    "graded": lambda t: bool(t.context_levels),
}


@dataclass(frozen=True)
class Scorer:
    actor: str                                        # LEARNER or TEACHER: the group whose ranks compute it
    method: str                                       # that actor's method, answering through `ship`
    writes: tuple[str, ...]
    applies_to: str = "all"                           # a key of APPLIES_TO
    args: Callable[[object], tuple] = lambda cfg: ()  # the method's arguments after the trajectories (whole Config)
    # True: the trajectories are scored with the teacher's prompt instead of their own (the student's weights with
    # the teacher's privileged context).
    teacher_prompt: bool = False


SCORERS: dict[str, Scorer] = {
    # the student's top-M as the support of the teacher's scores (distill.support=student_topk)
    "student_support": Scorer(LEARNER, "student_support", ("support_ids",), applies_to="with_context",
                              args=lambda cfg: (cfg.teacher.top_m,)),
    "teacher": Scorer(TEACHER, "teacher_scores", ("teacher_logprobs", "teacher_entropy", "teacher_topm_ids",
                                                  "teacher_topm_logprobs")),
    "teacher_full_vocab": Scorer(TEACHER, "teacher_scores", ("teacher_logprobs", "teacher_entropy",
                                                             "teacher_topm_ids", "teacher_topm_logprobs",
                                                             "teacher_hidden"), args=lambda cfg: (True,)),
    "teacher_without_context": Scorer(TEACHER, "teacher_scores_without_context", ("teacher_plain_logprobs",)),
    "teacher_levels": Scorer(TEACHER, "teacher_scores_at_levels", ("level_logprobs", "level_entropy",
                                                                   "level_topm_ids", "level_topm_logprobs"),
                             applies_to="graded"),
    "privileged_student": Scorer(LEARNER, "student_scores", ("privileged_logprobs",), applies_to="scored",
                                 args=lambda cfg: ("privileged_logprobs",), teacher_prompt=True),
    # the student's own sampled-token log-probs beside the teacher's (token selection by divergence, USD, Skill-SD)
    "student_own": Scorer(LEARNER, "student_scores", ("own_logprobs",), applies_to="scored",
                          args=lambda cfg: ("own_logprobs",)),
    # the updated student on the support, for the teacher's step toward it (teacher.weights=dual)
    "student_at_support": Scorer(LEARNER, "student_scores_at_support", ("student_topm_logprobs",),
                                 applies_to="scored"),
}



@dataclass(frozen=True)
class TeacherStep:
    method: str                      # the teacher actor's method, given the trajectories and the algorithm's args
    stage: str                       # its timing stage (timing_s/<stage>)
    before: tuple[str, ...] = ()     # scorers (SCORERS) that must run first
    applies_to: str = "all"          # the trajectories it is sent (a key of APPLIES_TO)


# The teacher's own steps after a student update, named by the algorithm (Algorithm.teacher_steps) or by the teacher's
# weight policy (teacher/weights.py); TeacherGroup.start_update runs them in order.
TEACHER_STEPS: dict[str, TeacherStep] = {
    # LOPD's composer step on the privileged margin (the pre-update student log-probs come from the learners' step)
    "composer": TeacherStep("update_composer", "update_composer"),
    # DualOPSD: one step of the teacher's backbone toward the updated student, on the teacher's support
    "toward_student": TeacherStep("step_toward_student", "teacher_step", before=("student_at_support",),
                                  applies_to="scored"),
    # teacher.weights=learn_successes: one step of the teacher's backbone on the batch's successes
    "learn_successes": TeacherStep("learn_successes", "teacher_step", applies_to="scored"),
}

BY_REFERENCE = tuple(name for name, s in SIGNALS.items() if s.by_reference)

Rows = dict[int, dict[str, np.ndarray]]


def read_by(actor: str) -> tuple[str, ...]:
    """The driver-held signals `actor` reads."""
    return tuple(name for name, s in SIGNALS.items() if actor in s.read_by)


def writes_of(scorers: tuple[str, ...]) -> set[str]:
    return {name for scorer in scorers for name in SCORERS[scorer].writes}


def ship(by_uid: Rows) -> tuple[Rows, Rows]:
    """What a scorer method returns from {uid: {signal: array}}: the signals the driver holds, and the blob of
    those that travel by reference (trajectories with nothing left out of each)."""
    unknown = {name for fields in by_uid.values() for name in fields} - set(SIGNALS)
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not declared signals (lopd_ray/data/signals.py)")

    def part(by_reference: bool) -> Rows:
        kept = {uid: {k: v for k, v in fields.items() if SIGNALS[k].by_reference == by_reference}
                for uid, fields in by_uid.items()}
        return {uid: fields for uid, fields in kept.items() if fields}
    return part(False), part(True)
