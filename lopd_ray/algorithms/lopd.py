"""LOPD: the student distills, by a divergence on the teacher's top-M + tail (reverse KL by default), toward a
frozen self-teacher whose prompt carries latent tokens composed from retrieved successful experience; the composer
keeps the teacher informative through a privileged-margin constraint enforced by dual ascent (METHOD 2.5).

Student and teacher log-probs are both taken at `algorithm.distill_temperature`, whatever the rollout sampled at."""
from __future__ import annotations

from lopd_ray.algorithms.base import Algorithm
from lopd_ray.algorithms.distill_losses import make_distill_loss


def dual_ascent(beta: float, measured_margin: float, margin: float, lr: float) -> float:
    """beta <- max(0, beta + lr * (m - measured)): grows while the margin constraint is violated."""
    return max(0.0, beta + lr * (margin - measured_margin))


def outcome_sign(reward: float) -> float:
    """A(tau) = 2r - 1: +1 for a success, -1 for a failure."""
    return 2.0 * reward - 1.0


class LOPD(Algorithm):
    needs_retrieval = True
    needs_teacher = True
    returns_student_logprobs = True
    reads = ("algorithm.lopd", "algorithm.distill_temperature", "bank", "composer", "teacher")

    def __init__(self, cfg):
        super().__init__(cfg)
        self.divergence = make_distill_loss(cfg.lopd.distill_loss, cfg.lopd.jsd_beta)

    @property
    def updates_composer(self) -> bool:
        return self.cfg.lopd.margin_enabled

    def learner_temperature(self, cfg) -> float:
        return cfg.algorithm.distill_temperature

    def prepare(self, trajs):
        """A task with nothing retrieved gets no teacher signal: its trajectory carries no distillation weight."""
        kept = [t for t in trajs if t.teacher_topm_ids is not None]
        return kept, {"lopd/no_context_samples": float(len(trajs) - len(kept))}

    def token_loss(self, batch, logp_BT, old_logp_BT, ref_logp_BT, student_topm_BTM=None):
        if student_topm_BTM is None:  # a rank's empty micro-batch: zero loss, same graph, paired collectives
            return logp_BT * 0.0, {}
        kl_BT = self.divergence(student_topm_BTM, batch["teacher_topm_logprobs"]) * batch["distill_mask"]
        gap_BT = (batch["teacher_topm_logprobs"][..., 0] - student_topm_BTM[..., 0]).detach()
        return kl_BT, {"lopd/student_kl": kl_BT.detach(), "lopd/top1_gap": gap_BT}
