"""GRPO: group-normalized outcome advantages with a PPO-clip policy loss and an optional k3 reference KL. DAPO,
Dr.GRPO and RLOO are options of it: asymmetric clip bounds (eps_high), dynamic sampling (refill_rounds), soft
overlong punishment (overlong_buffer), no std normalization, a leave-one-out baseline.

The learner scores tokens at `rollout.temperature` without the rollout's top-k/top-p filters, and the PPO ratio
compares the learner's own log-probs before and after the update (never the engine's filtered log-probs), so both
sides of the ratio are the same distribution."""
from __future__ import annotations

import numpy as np

from lopd_ray.algorithms.base import Algorithm, per_token
from lopd_ray.algorithms.losses import clipped_pg, k3_kl
from lopd_ray.data.groups import by_group
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.errors import require


def group_advantages(rewards: list[float], normalize_by_std: bool, baseline: str = "group_mean",
                     eps: float = 1e-6) -> list[float]:
    """r minus the group's baseline: GRPO's `group_mean`, divided by the group's unbiased std (Bessel's correction,
    as verl and TRL) when `normalize_by_std`; or RLOO's `leave_one_out`, the mean of the OTHER samples, never divided
    (RLOO's advantage has no std)."""
    r = np.asarray(rewards, dtype=np.float64)
    baseline_of, scaled = BASELINES[baseline]
    adv = r - baseline_of(r)
    if scaled and normalize_by_std and len(r) > 1:
        adv = adv / (r.std(ddof=1) + eps)
    return adv.tolist()


# name -> (the baseline of each sample, whether normalize_adv_by_std divides by the group's std)
BASELINES = {
    "group_mean": (lambda r: r.mean(), True),
    "leave_one_out": (lambda r: (r.sum() - r) / max(len(r) - 1, 1), False),
}


def overlong_penalty(t: Trajectory, buffer: int, penalty: float) -> float:
    """DAPO's soft overlong punishment, on the longest model turn: 0 up to (cap - buffer) tokens, then falling
    linearly to -penalty at the turn's token cap; 0 when buffer is 0."""
    if buffer <= 0 or t.max_turn_tokens <= 0:
        return 0.0
    excess = t.longest_turn_tokens - (t.max_turn_tokens - buffer)
    return -penalty * min(max(excess, 0) / buffer, 1.0)


class GRPO(Algorithm):
    reads = ("algorithm.grpo",)
    choices = {**Algorithm.choices, "algorithm.grpo.baseline": BASELINES}

    @classmethod
    def check(cls, cfg, context) -> None:
        super().check(cfg, context)
        g = cfg.algorithm.grpo
        require(g.overlong_buffer < cfg.rollout.max_new_tokens,
                f"algorithm.grpo.overlong_buffer={g.overlong_buffer} must be below rollout.max_new_tokens="
                f"{cfg.rollout.max_new_tokens}: the buffer is the last part of a turn's token budget")

    @property
    def needs_reference(self) -> bool:
        return self.cfg.grpo.kl_coef > 0

    @property
    def refill_rounds(self) -> int:
        return self.cfg.grpo.refill_rounds

    def shaped_rewards(self, members: list[Trajectory]) -> list[float]:
        g = self.cfg.grpo
        return [t.reward + overlong_penalty(t, g.overlong_buffer, g.overlong_penalty) for t in members]

    def informative(self, members: list[Trajectory]) -> bool:
        """A group whose rewards all agree has every advantage zero: no signal."""
        rewards = self.shaped_rewards(members)
        return max(rewards) - min(rewards) >= 1e-9

    def prepare(self, trajs):
        groups = by_group(trajs)
        kept, g = [], self.cfg.grpo
        for members in filter(self.informative, groups.values()):
            for t, a in zip(members, group_advantages(self.shaped_rewards(members), g.normalize_adv_by_std,
                                                      g.baseline)):
                t.advantages = per_token(a, t.loss_mask)
                kept.append(t)
        penalties = [overlong_penalty(t, g.overlong_buffer, g.overlong_penalty) for t in trajs]
        return kept, {"grpo/zero_variance_groups": float(len(groups) - len({t.group_id for t in kept})),
                      "grpo/groups": float(len(groups)), "grpo/trained_samples": float(len(kept)),
                      "grpo/overlong_penalty_mean": float(np.mean(penalties)) if penalties else 0.0}

    def token_loss(self, batch, logp_BT, old_logp_BT, ref_logp_BT, student_topm_BTM=None, full_divergence_BT=None):
        g = self.cfg.grpo
        loss, clipped = clipped_pg(logp_BT, old_logp_BT, batch["advantages"], g.eps_low, g.eps_high)
        metrics = {"actor/clipfrac": clipped, "actor/ratio": (logp_BT - old_logp_BT).detach().exp()}
        if ref_logp_BT is not None:
            kl = k3_kl(logp_BT, ref_logp_BT)
            loss = loss + g.kl_coef * kl
            metrics["actor/ref_kl"] = kl.detach()
        return loss, metrics
