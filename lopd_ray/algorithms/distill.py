"""On-policy self-distillation: the student samples, a teacher whose prompt carries a privileged context (chosen by
`context.name`: the task's solution, another task's, a successful sibling, latent experience, or nothing) scores
every token the student produced, and the student follows it by a per-token loss (`algorithm.distill.loss`): a
divergence on the teacher's top-M + tail, or an estimator on the sampled token. An RL term can be mixed in
(`algorithm.distill.rl_coef`: GRPO's clipped objective on group-normalized rewards, clipped by algorithm.grpo's
eps), since pure distillation cannot pass its teacher. OPSD, OP2SD, SDFT and SDPO are this algorithm with different
contexts, teacher weights and losses (see the recipes and docs/methods.md).

Student and teacher log-probs are both taken at `algorithm.distill_temperature`, whatever the rollout sampled at."""
from __future__ import annotations

import numpy as np
import torch

from lopd_ray.algorithms.base import Algorithm, per_token
from lopd_ray.algorithms.distill_losses import DISTILL_LOSSES, SAMPLED_LOSSES, make_distill_loss, with_tail
from lopd_ray.algorithms.grpo import by_group, group_advantages
from lopd_ray.algorithms.losses import clipped_pg


class Distill(Algorithm):
    needs_teacher = True
    reads = ("algorithm.distill", "algorithm.distill_temperature", "teacher", "context")

    def __init__(self, cfg):
        super().__init__(cfg)
        d = cfg.distill
        self.divergence = (make_distill_loss(d.loss, d.jsd_beta, d.tail, d.token_clip) if d.loss in DISTILL_LOSSES
                           else None)
        self.sampled_loss = SAMPLED_LOSSES.get(d.loss)

    @classmethod
    def reads_for(cls, cfg) -> tuple[str, ...]:
        """GRPO's clip settings are read when an RL term is mixed in."""
        return cls.reads + (("algorithm.grpo",) if cfg.distill.rl_coef > 0 else ())

    def learner_temperature(self, cfg) -> float:
        return cfg.algorithm.distill_temperature

    def prepare(self, trajs):
        """Without an RL term, a sample the context provider had nothing for carries no signal and is dropped; with
        one, every sample gets its group-normalized advantage and only the distillation term skips those samples.
        `route` decides which samples each term sees, `rl_token_weight` how the RL credit spreads over tokens."""
        d = self.cfg.distill
        scored = [t for t in trajs if t.teacher_topm_ids is not None]
        stats = {"distill/no_context_samples": float(len(trajs) - len(scored)), **teacher_diagnostics(scored),
                 **context_decomposition(scored)}
        route = ROUTES[d.route]
        for t in scored:
            t.distill_weights = route(t, d.success_threshold)[1] * t.loss_mask.astype(np.float32)
        if d.rl_coef <= 0:
            return scored, stats
        g = self.cfg.grpo
        for members in by_group(trajs).values():
            advantages = group_advantages([t.reward for t in members], g.normalize_adv_by_std, g.baseline)
            for t, a in zip(members, advantages):
                rl_weight = route(t, d.success_threshold)[0] * RL_TOKEN_WEIGHTS[d.rl_token_weight](t)
                t.advantages = rl_weight * per_token(a, t.loss_mask)
        return trajs, stats

    def token_loss(self, batch, logp_BT, old_logp_BT, ref_logp_BT, student_topm_BTM=None):
        d, metrics = self.cfg.distill, {}
        if "distill_mask" in batch:
            if self.divergence is not None:
                term_BT = self.divergence(student_topm_BTM, batch["teacher_topm_logprobs"])
                metrics["distill/top1_gap"] = (batch["teacher_topm_logprobs"][..., 0]
                                               - student_topm_BTM[..., 0]).detach()
            else:
                term_BT = self.sampled_loss(logp_BT, batch["teacher_logprobs"], old_logp_BT, d.is_clip)
            term_BT = term_BT * batch["distill_mask"]
            metrics["distill/student_kl" if self.divergence is not None else "distill/sampled_loss"] = term_BT.detach()
            loss_BT = d.distill_coef * term_BT
        else:  # no sample of this micro-batch has a teacher signal (or a rank's empty micro-batch)
            loss_BT = logp_BT * 0.0
        if d.rl_coef > 0:
            g = self.cfg.grpo
            pg_BT, clipped_BT = clipped_pg(logp_BT, old_logp_BT, batch["advantages"], g.eps_low, g.eps_high)
            loss_BT = loss_BT + d.rl_coef * pg_BT
            metrics.update({"actor/pg_loss": pg_BT.detach(), "actor/clipfrac": clipped_BT})
        return loss_BT, metrics


def teacher_probability_weights(t) -> np.ndarray:
    """Per action token, the teacher's probability of the sampled token over its mean on the sample (mean 1); 1
    everywhere without a teacher signal."""
    if t.teacher_logprobs is None:
        return np.ones(len(t.loss_mask), dtype=np.float32)
    p = np.exp(t.teacher_logprobs.astype(np.float64)) * t.loss_mask
    return (p / max(p.sum() / max(t.loss_mask.sum(), 1), 1e-12)).astype(np.float32)


# Which terms see a sample: (RL weight, distillation weight).
ROUTES = {
    "all": lambda t, threshold: (1.0, 1.0),
    # H2SD: the RL term on successes, the distillation term on failures.
    "by_outcome": lambda t, threshold: (1.0, 0.0) if t.reward >= threshold else (0.0, 1.0),
}
RL_TOKEN_WEIGHTS = {
    "uniform": lambda t: 1.0,
    "teacher_prob": teacher_probability_weights,  # H2SD's re-weighting of a success's credit
}


def teacher_diagnostics(trajs) -> dict[str, float]:
    """Means over action tokens of the teacher's probability of the sampled token (low: the student went where the
    teacher would not) and of the entropy of its top-M + tail distribution (high: a genuine branch point)."""
    if not trajs:
        return {}
    mask = np.concatenate([t.loss_mask for t in trajs]).astype(bool)
    sampled = np.exp(np.concatenate([t.teacher_logprobs for t in trajs]).astype(np.float64))[mask]
    topm = torch.from_numpy(np.concatenate([t.teacher_topm_logprobs for t in trajs]).astype(np.float64))
    support = with_tail(topm)
    entropy = -(support.exp() * support).sum(-1).numpy()[mask]
    return {"distill/teacher_sampled_prob": float(sampled.mean()) if mask.any() else 0.0,
            "distill/teacher_entropy_topm": float(entropy.mean()) if mask.any() else 0.0}


def context_decomposition(trajs) -> dict[str, float]:
    """Where the teacher scored without its context too (`algorithm.distill.diagnose_context`): per action token,
    the supervision the context induces, log p_T(a | c) - log p_T(a), and the teacher's own, log p_T(a) - the
    student's log-prob at sampling time; means, and the context's share of their absolute sizes."""
    trajs = [t for t in trajs if t.teacher_plain_logprobs is not None]
    if not trajs:
        return {}
    mask = np.concatenate([t.loss_mask for t in trajs]).astype(bool)
    with_context, plain, student = (np.concatenate([getattr(t, name) for t in trajs]).astype(np.float64)[mask]
                                    for name in ("teacher_logprobs", "teacher_plain_logprobs", "rollout_logprobs"))
    context, own = with_context - plain, plain - student
    size = np.abs(context).mean() + np.abs(own).mean()
    return {"distill/context_gain": float(context.mean()), "distill/teacher_own_gap": float(own.mean()),
            "distill/context_share": float(np.abs(context).mean() / size) if size > 0 else 0.0}
