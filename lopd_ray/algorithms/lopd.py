"""LOPD: on-policy self-distillation from a frozen self-teacher whose prompt carries latent tokens composed from
retrieved successful experience (`context.name=latent`); its hook is the composer's step, which keeps the teacher
informative through a privileged-margin constraint enforced by dual ascent (METHOD 2.5)."""
from __future__ import annotations

from typing import Callable

import torch

from lopd_ray.algorithms.distill import Distill
from lopd_ray.algorithms.distill_losses import DISTILL_LOSSES
from lopd_ray.errors import require


def composer_terms(teacher_BTM1: torch.Tensor, student_sampled_BT: torch.Tensor, student_topm_BTM: torch.Tensor,
                   mask_BT: torch.Tensor, sign_B: torch.Tensor, beta: float, margin: float,
                   divergence: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The composer's loss per trajectory (METHOD 2.5), from the teacher's log-probs with the latents in its prompt
    (`teacher_BTM1[..., 0]` at the sampled token, `[..., 1:]` at its top-M) and the pre-update student's: the
    divergence on the top-M averaged over the trajectory's tokens [B]; beta times the privileged-margin violation
    m - A(tau) * mean(delta) [B]; and delta, the teacher's log-prob of each sampled token minus the student's [B, T]."""
    tokens_B = mask_BT.sum(-1).clamp(min=1.0)
    delta_BT = teacher_BTM1[..., 0] - student_sampled_BT
    kl_B = (divergence(student_topm_BTM, teacher_BTM1[..., 1:]) * mask_BT).sum(-1) / tokens_B
    margin_B = beta * (margin - sign_B * (delta_BT * mask_BT).sum(-1) / tokens_B)
    return kl_B, margin_B, delta_BT


def margin_target(cfg, first_measured: float | None) -> float:
    """The margin m the dual ascent holds: `cfg.margin`, or with `cfg.margin_ratio` > 0 that ratio of the advantage
    measured at the composer's first step (none below 0; `cfg.margin` until the first step has measured it)."""
    if cfg.margin_ratio <= 0 or first_measured is None:
        return cfg.margin
    return cfg.margin_ratio * max(first_measured, 0.0)


def dual_ascent(beta: float, measured_margin: float, margin: float, lr: float) -> float:
    """beta <- max(0, beta + lr * (m - measured)): grows while the margin constraint is violated."""
    return max(0.0, beta + lr * (margin - measured_margin))


def outcome_sign(reward: float) -> float:
    """A(tau) = 2r - 1: +1 for a success, -1 for a failure."""
    return 2.0 * reward - 1.0


class LOPD(Distill):
    required_context = "latent"
    returns_student_logprobs = True
    reads = Distill.reads + ("algorithm.lopd",)

    @classmethod
    def check(cls, cfg, context) -> None:
        super().check(cfg, context)
        require(cfg.algorithm.distill.loss in DISTILL_LOSSES,
                f"algorithm.name={cfg.algorithm.name} steps its composer on a top-M divergence, which "
                f"algorithm.distill.loss='{cfg.algorithm.distill.loss}' is not: choose one of "
                f"{sorted(DISTILL_LOSSES)}")
        ratio = cfg.algorithm.lopd.margin_ratio
        require(0.0 <= ratio <= 1.0, f"algorithm.lopd.margin_ratio={ratio} must be in [0, 1]: the share of the "
                f"composer's first measured advantage the margin keeps (0: the absolute algorithm.lopd.margin)")

    @property
    def updates_composer(self) -> bool:
        return self.cfg.lopd.margin_enabled
