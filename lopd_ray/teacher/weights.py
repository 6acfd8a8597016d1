"""What the teacher's backbone weights do during training (`teacher.weights`): follow the student after each weight
sync at a rate (theta_T <- theta_T + rate * (theta_S - theta_T)), or never, and whether the teacher takes a
gradient step of its own toward the updated student after each student update."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class WeightPolicy:
    rate: Callable[[object], Optional[float]]  # teacher config -> follow rate at each sync; None: never
    teacher_steps: tuple[str, ...] = ()  # its own steps after each student update (data/signals.TEACHER_STEPS)


TEACHER_WEIGHTS = {
    "frozen": WeightPolicy(lambda teacher_cfg: None),                # the initial checkpoint (LOPD, OPSD, ...)
    "live": WeightPolicy(lambda teacher_cfg: 1.0),                   # the current student (Skill-SD)
    "ema": WeightPolicy(lambda teacher_cfg: teacher_cfg.ema_rate),   # an EMA of the student (SDFT, SDPO)
    # DualOPSD, known from its abstract only: after the student's update, the teacher takes a gradient step
    # (teacher.lr) toward the updated student on the same trajectories.
    "dual": WeightPolicy(lambda teacher_cfg: None, teacher_steps=("toward_student",)),
    # CONTRIBUTING.md's second worked example: after each student update, one step of the teacher's backbone
    # (teacher.lr) on the batch's successful responses, each under the teacher's own context.
    "learn_successes": WeightPolicy(lambda teacher_cfg: None, teacher_steps=("learn_successes",)),
}


def follow_rate(teacher_cfg) -> Optional[float]:
    return TEACHER_WEIGHTS[teacher_cfg.weights].rate(teacher_cfg)


def weight_steps(teacher_cfg) -> tuple[str, ...]:
    return TEACHER_WEIGHTS[teacher_cfg.weights].teacher_steps


def steps_toward_student(teacher_cfg) -> bool:
    return "toward_student" in weight_steps(teacher_cfg)
