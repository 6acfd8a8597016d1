"""LOPD: on-policy self-distillation from a frozen self-teacher whose prompt carries latent tokens composed from
retrieved successful experience (`context.name=latent`); its hook is the composer's step, which keeps the teacher
informative through a privileged-margin constraint enforced by dual ascent (METHOD 2.5)."""
from __future__ import annotations

from lopd_ray.algorithms.distill import Distill


def dual_ascent(beta: float, measured_margin: float, margin: float, lr: float) -> float:
    """beta <- max(0, beta + lr * (m - measured)): grows while the margin constraint is violated."""
    return max(0.0, beta + lr * (margin - measured_margin))


def outcome_sign(reward: float) -> float:
    """A(tau) = 2r - 1: +1 for a success, -1 for a failure."""
    return 2.0 * reward - 1.0


class LOPD(Distill):
    required_context = "latent"
    updates_composer_with_divergence = True
    returns_student_logprobs = True
    reads = Distill.reads + ("algorithm.lopd",)

    @property
    def updates_composer(self) -> bool:
        return self.cfg.lopd.margin_enabled
