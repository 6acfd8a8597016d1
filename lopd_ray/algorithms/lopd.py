"""LOPD: on-policy self-distillation from a frozen self-teacher whose prompt carries latent tokens composed from
retrieved successful experience (`context.name=latent`); its hook is the composer's step, which keeps the teacher
informative through a privileged-margin constraint enforced by dual ascent (METHOD 2.5). The maths of that step and
of the composer's cold start, and beta itself (on the driver, in the run's checkpoint), live here; the teacher actor
runs the forwards, the backward and the optimizer step."""
from __future__ import annotations

from typing import Callable

import torch

from lopd_ray.algorithms.distill import Distill
from lopd_ray.algorithms.distill_losses import DISTILL_LOSSES
from lopd_ray.algorithms.dual import dual_ascent
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


def anchor_loss(latents_and_anchors: list[tuple[torch.Tensor, torch.Tensor, int]], coef: float,
                device=None) -> torch.Tensor:
    """The anchor (METHOD 2.5): coef times the sum over distinct encodings (c_phi, c_phi0, the samples sharing it)
    of samples * mean((c_phi - c_phi0)^2)."""
    loss = torch.zeros((), device=device)
    for latents, anchor, samples in latents_and_anchors:
        loss = loss + samples * ((latents.float() - anchor.float()) ** 2).mean()
    return coef * loss


def answer_nll(logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """The cold start's objective (METHOD 2.4): each answer's mean token NLL, summed over the answers."""
    return -((logp_BT * mask_BT).sum(-1) / mask_BT.sum(-1)).sum()


def regression_loss(latents: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The cold start's regression of the composer onto fitted entry latents: the mean squared error relative to the
    targets' mean square (1 for latents at 0)."""
    return ((latents - target) ** 2).mean() / (target ** 2).mean()


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

    def __init__(self, cfg):
        super().__init__(cfg)
        self.beta = cfg.lopd.beta_init
        self.first_delta: float | None = None  # the advantage measured at the composer's first step

    def teacher_steps(self) -> tuple[str, ...]:
        return ("composer",) if self.cfg.lopd.margin_enabled else ()

    def teacher_step_args(self, name: str) -> tuple:
        """The composer's step takes beta and the margin it is held to now."""
        return self.beta, margin_target(self.cfg.lopd, self.first_delta)

    def after_teacher_step(self, name: str, metrics: dict[str, float]) -> dict[str, float]:
        """Dual ascent on beta from the advantage the step measured (lopd/delta, over every rank's trajectories)."""
        if "lopd/delta" not in metrics:  # no trajectory had retrieved experience
            return {"lopd/beta": self.beta}
        measured = metrics["lopd/delta"]
        if self.first_delta is None:
            self.first_delta = measured
        m, used = margin_target(self.cfg.lopd, self.first_delta), self.beta
        self.beta = dual_ascent(self.beta, m - measured, self.cfg.lopd.dual_lr)
        return {"lopd/beta": used, "lopd/margin": m, "lopd/margin_violation": max(0.0, m - measured)}

    def anchor_loss(self, latents_and_anchors: list[tuple[torch.Tensor, torch.Tensor, int]], device=None
                    ) -> torch.Tensor:
        return anchor_loss(latents_and_anchors, self.cfg.lopd.anchor_coef, device)

    def state_dict(self) -> dict:
        return {"beta": self.beta, "first_delta": self.first_delta}

    def load_state_dict(self, state: dict) -> None:
        self.beta = state.get("beta", self.beta)
        self.first_delta = state.get("first_delta", self.first_delta)
