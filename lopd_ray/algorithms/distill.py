"""On-policy self-distillation: the student samples, a teacher whose prompt carries a privileged context (chosen by
`context.name`: the task's solution, another task's, a successful sibling, a skill, a hint, latent experience, or
nothing) scores every token the student produced, and the student follows it by a per-token loss
(`algorithm.distill.loss`): a divergence on a support (`support`: the teacher's top-M, the student's, or the full
vocabulary), or an estimator on the sampled token. Routes and token selection decide which samples and tokens each
term sees. An RL term can be mixed in (`algorithm.distill.rl_coef`: GRPO's clipped objective on group-normalized
rewards, clipped by algorithm.grpo's eps), since pure distillation cannot pass its teacher. OPSD, OP2SD, SDFT, SDPO,
Skill-SD, H2SD, DualOPSD, DOPD and OPD are this algorithm with different contexts, teacher weights, losses and routes
(see the recipes and docs/methods.md); H2SD, DualOPSD and DOPD are built from their abstracts only.

The sampled-token losses carry the importance ratio of this update, min(p_S / p_S_old, is_clip), in their estimator;
a divergence is weighted by its value (no gradient through it) only with `importance_weighted`, as SDPO's official
code (the other methods' definitions have no such factor); 1 on-policy.

Student and teacher log-probs are both taken at `algorithm.distill_temperature`, whatever the rollout sampled at."""
from __future__ import annotations

from typing import Optional

import numpy as np

from lopd_ray.algorithms.base import Algorithm, per_token
from lopd_ray.algorithms.distill_diagnostics import (context_decomposition, gap_by_token_class, privilege_diagnostics,
                                                     teacher_diagnostics, update_alignment)
from lopd_ray.algorithms.distill_losses import DISTILL_LOSSES, SAMPLED_LOSSES, TAIL_CLAMPS, make_distill_loss
from lopd_ray.algorithms.grpo import GRPO, group_advantages
from lopd_ray.algorithms.losses import clipped_pg, truncated_is_weights
from lopd_ray.data.groups import by_group
from lopd_ray.errors import require


class Distill(Algorithm):
    needs_teacher = True
    reads = ("algorithm.distill", "algorithm.distill_temperature", "teacher", "context")

    def __init__(self, cfg):
        super().__init__(cfg)
        d = cfg.distill
        self.divergence = (make_distill_loss(d.loss, d.jsd_beta, d.tail, d.pointwise_clip, d.tail_clamp)
                           if d.loss in DISTILL_LOSSES else None)
        # On the full vocabulary the support is exact: no tail, nothing to renormalize.
        self.full_vocab_divergence = (make_distill_loss(d.loss, d.jsd_beta, False, d.pointwise_clip)
                                      if d.loss in DISTILL_LOSSES else None)
        self.sampled_loss = SAMPLED_LOSSES.get(d.loss)

    def scorers(self) -> tuple[str, ...]:
        d = self.cfg.distill
        return (SUPPORT_SCORERS[d.support] + (("teacher_without_context",) if d.diagnose_context else ())
                + ROUTE_SCORERS.get(d.route, ()) + SELECTION_SCORERS.get(d.token_selection, ()))

    @property
    def returns_student_logprobs(self) -> bool:
        return self.cfg.distill.diagnose_context

    @property
    def wants_updated_logprobs(self) -> bool:
        return self.cfg.distill.diagnose_context

    def update_diagnostics(self, trajs, updated):
        return update_alignment(trajs, updated)

    @classmethod
    def reads_for(cls, cfg) -> tuple[str, ...]:
        """GRPO's clip settings are read when an RL term is mixed in."""
        return cls.reads + (("algorithm.grpo",) if cfg.distill.rl_coef > 0 else ())

    @classmethod
    def choices_for(cls, cfg):
        return {**super().choices_for(cfg), "algorithm.distill.loss": {**DISTILL_LOSSES, **SAMPLED_LOSSES},
                "algorithm.distill.support": SUPPORT_SCORERS, "algorithm.distill.route": ROUTES,
                "algorithm.distill.rl_token_weight": RL_TOKEN_WEIGHTS,
                "algorithm.distill.token_selection": TOKEN_SELECTIONS, "algorithm.distill.tail_clamp": TAIL_CLAMPS,
                **(GRPO.choices if cfg.distill.rl_coef > 0 else {})}

    @classmethod
    def check(cls, cfg, context) -> None:
        super().check(cfg, context)
        d = cfg.algorithm.distill
        require(cfg.algorithm.distill_temperature > 0,
                f"algorithm.distill_temperature={cfg.algorithm.distill_temperature} must be > 0 (log-probs divide "
                f"by it)")
        require(0.0 <= d.jsd_beta <= 1.0, f"algorithm.distill.jsd_beta={d.jsd_beta} must be in [0, 1] (0: forward "
                                          f"KL, 1: reverse)")
        require(0.0 < d.token_keep_fraction <= 1.0,
                f"algorithm.distill.token_keep_fraction={d.token_keep_fraction} must be in (0, 1]")
        require(d.is_clip > 0, f"algorithm.distill.is_clip={d.is_clip} must be > 0 (the importance ratio's cap)")
        require(not d.importance_weighted or d.loss in DISTILL_LOSSES,
                f"algorithm.distill.importance_weighted weights a divergence by the importance ratio; "
                f"algorithm.distill.loss={d.loss} is a sampled-token loss that carries the ratio itself: drop the key")
        require(d.support != "full_vocab" or cfg.teacher.weights == "frozen",
                f"algorithm.distill.support=full_vocab rebuilds the teacher with its initial output head, which a "
                f"teacher.weights={cfg.teacher.weights} teacher moves away from: set teacher.weights=frozen or "
                f"another support")
        require(not (d.diagnose_context and context.uses_latents),
                "algorithm.distill.diagnose_context splits the supervision of a text context; context.name=latent "
                "has none: drop the key")
        require(d.route != "privilege_gap" or not context.uses_latents,
                "algorithm.distill.route=privilege_gap compares the teacher with the student given the same text "
                "context; context.name=latent gives the student none: choose a text context")
        require(d.route != "privilege_gap" or cfg.teacher.model_path is not None or d.privilege_light_weight > 0,
                "algorithm.distill.route=privilege_gap with a self-teacher and privilege_light_weight=0 distils "
                "nothing: the teacher starts equal to the privileged student (no gap); set "
                "algorithm.distill.privilege_light_weight above 0 (e.g. 0.1) or teacher.model_path to a different "
                "model")

    def learner_temperature(self, cfg) -> float:
        return cfg.algorithm.distill_temperature

    def prepare(self, trajs):
        """Without an RL term, a sample the context provider had nothing for carries no signal and is dropped; with
        one, every sample gets its group-normalized advantage and only the distillation term skips those samples.
        `route` decides which samples each term sees, `rl_token_weight` how the RL credit spreads over tokens."""
        d = self.cfg.distill
        scored = [t for t in trajs if t.teacher_logprobs is not None]
        stats = {"distill/no_context_samples": float(len(trajs) - len(scored)), **teacher_diagnostics(scored),
                 **context_decomposition(scored), **privilege_diagnostics(scored, d.privilege_gap_min),
                 **gap_by_token_class(scored)}
        route = ROUTES[d.route]
        for t in scored:
            t.distill_weights = distill_weights(route(t, d)[1], selected_tokens(t, d.token_selection,
                                                                                 d.token_keep_fraction), t.loss_mask)
        if d.rl_coef <= 0:
            return scored, stats
        g = self.cfg.grpo
        for members in by_group(trajs).values():
            advantages = group_advantages([t.reward for t in members], g.normalize_adv_by_std, g.baseline)
            for t, a in zip(members, advantages):
                rl_weight = route(t, d)[0] * RL_TOKEN_WEIGHTS[d.rl_token_weight](t)
                t.advantages = rl_weight * per_token(a, t.loss_mask)
        return trajs, stats

    def token_loss(self, batch, logp_BT, old_logp_BT, ref_logp_BT, student_topm_BTM=None, full_divergence_BT=None):
        d, metrics = self.cfg.distill, {}
        if "distill_mask" in batch:
            if self.divergence is not None:
                metrics["distill/top1_gap"] = (batch["teacher_topm_logprobs"][..., 0]
                                               - student_topm_BTM[..., 0]).detach()
            if full_divergence_BT is not None:
                term_BT = full_divergence_BT
            elif self.divergence is not None:
                term_BT = self.divergence(student_topm_BTM, batch["teacher_topm_logprobs"])
            else:
                term_BT = self.sampled_loss(logp_BT, batch["teacher_logprobs"], old_logp_BT, d.is_clip)
            term_BT = term_BT * batch["distill_mask"]
            metrics["distill/student_kl" if self.divergence is not None else "distill/sampled_loss"] = term_BT.detach()
            if d.importance_weighted:  # a divergence: SDPO's weight (the sampled-token losses carry their own)
                term_BT = term_BT * truncated_is_weights(logp_BT, old_logp_BT, d.is_clip)
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


def privileged_tokens(t, gap_min: float, light_weight: float = 0.0) -> np.ndarray:
    """DOPD's routing, known from its abstract and summaries only. Per action token, the privilege advantage gap
    log p_T(a | c) - log p_S(a | c): the privileged teacher (the teacher with its context) against the privileged
    student (the student given the same context) on the sampled token; with on-policy distillation's per-token
    advantage of a policy over the student, log pi(a) - log p_S(a), it is the gap of the two advantages (the
    student's own log-prob cancels). Weight 1 where it exceeds gap_min nats (a capability gap the student can
    close), light_weight where it does not (the teacher's edge is the information the student will never have)."""
    if t.teacher_logprobs is None or t.privileged_logprobs is None:
        return np.zeros(len(t.loss_mask), dtype=np.float32)
    beats = t.teacher_logprobs.astype(np.float64) - t.privileged_logprobs > gap_min
    return (np.where(beats, 1.0, light_weight) * (t.loss_mask > 0)).astype(np.float32)


# Which terms see a sample: (RL weight, distillation weight: one number, or one per token).
def teacher_step_loss(student_topm_BTM, teacher_BTM, mask_BT, total_tokens: float, divergence):
    """DualOPSD's step of the teacher toward the updated student (teacher.weights=dual): the distillation divergence
    from the updated student (fixed) to the teacher on the teacher's top-M, summed over a micro-batch's action tokens
    and divided by the action tokens of the whole batch (every rank's), so that the micro-batches' losses add up to
    the batch's token mean."""
    return (divergence(student_topm_BTM, teacher_BTM) * mask_BT).sum() / max(total_tokens, 1.0)


# The scorers each support needs: the teacher's top-M, the student's (scored by the learners first), or the
# teacher's hidden states for the full vocabulary.
SUPPORT_SCORERS = {"teacher_topm": ("teacher",), "student_topk": ("student_support", "teacher"),
                   "full_vocab": ("teacher_full_vocab",)}
# The scorers a route needs besides.
ROUTE_SCORERS = {"privilege_gap": ("privileged_student",)}

ROUTES = {
    "all": lambda t, d: (1.0, 1.0),
    # H2SD: the RL term on successes, the distillation term on failures.
    "by_outcome": lambda t, d: (1.0, 0.0) if t.reward >= d.success_threshold else (0.0, 1.0),
    # DOPD, known from its abstract only: full weight on the tokens where the privileged teacher beats the
    # privileged student, light elsewhere (no "privilege illusion").
    "privilege_gap": lambda t, d: (1.0, privileged_tokens(t, d.privilege_gap_min, d.privilege_light_weight)),
}
RL_TOKEN_WEIGHTS = {
    "uniform": lambda t: 1.0,
    "teacher_prob": teacher_probability_weights,  # H2SD's re-weighting of a success's credit
}


# Per-token scores that `token_selection` ranks a sample's tokens by ("all": no selection).
TOKEN_SELECTIONS = {
    "all": None,
    "teacher_entropy": lambda t: t.teacher_entropy,
    # how far the teacher is from the student on the sampled token, both at the distillation temperature
    "divergence": lambda t: np.abs(t.teacher_logprobs.astype(np.float64) - t.own_logprobs),
}
# The scorers a selection needs besides.
SELECTION_SCORERS = {"divergence": ("student_own",)}


def selected_tokens(t, selection: str, keep_fraction: float) -> Optional[np.ndarray]:
    """1 on the top keep_fraction of the sample's action tokens by the selection's score (at least one token),
    0 elsewhere; None for "all"."""
    score_of = TOKEN_SELECTIONS[selection]
    if score_of is None:
        return None
    score = np.where(t.loss_mask == 1, score_of(t), -np.inf)
    keep = np.zeros(len(score), dtype=np.float32)
    keep[np.argsort(-score, kind="stable")[:max(1, round(keep_fraction * t.num_action_tokens))]] = 1.0
    return keep * t.loss_mask


def distill_weights(route_weight, selected: Optional[np.ndarray], loss_mask: np.ndarray) -> Optional[np.ndarray]:
    """The per-token weight of the distillation term from the route's weight (one number or one per token) and the
    selected tokens; None where it is the loss mask itself (the learner reads it so, and nothing is shipped)."""
    if selected is None and np.isscalar(route_weight) and route_weight == 1.0:
        return None
    weights = route_weight * loss_mask.astype(np.float32)
    return weights * selected if selected is not None else weights
