"""What the teacher's backbone weights do during training: `teacher.weights` -> the rate at which they follow the
student after each weight sync (theta_T <- theta_T + rate * (theta_S - theta_T)); None: never (frozen)."""
from __future__ import annotations

from typing import Optional

TEACHER_WEIGHTS = {
    "frozen": lambda teacher_cfg: None,               # the initial checkpoint (LOPD, OPSD, ...)
    "live": lambda teacher_cfg: 1.0,                  # the current student (Skill-SD)
    "ema": lambda teacher_cfg: teacher_cfg.ema_rate,  # an exponential moving average of the student (SDFT, SDPO)
}


def follow_rate(teacher_cfg) -> Optional[float]:
    return TEACHER_WEIGHTS[teacher_cfg.weights](teacher_cfg)
