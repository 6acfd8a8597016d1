"""GRPO: group-normalized outcome advantages with a PPO-clip policy loss and an optional k3 reference KL.

The learner scores tokens at `rollout.temperature` without the rollout's top-k/top-p filters, and the PPO ratio
compares the learner's own log-probs before and after the update (never the engine's filtered log-probs), so both
sides of the ratio are the same distribution."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from lopd_ray.algorithms.base import Algorithm, per_token
from lopd_ray.algorithms.losses import clipped_pg, k3_kl
from lopd_ray.data.trajectory import Trajectory


def group_advantages(rewards: list[float], normalize_by_std: bool, baseline: str = "group_mean",
                     eps: float = 1e-6) -> list[float]:
    """r minus the group's baseline (`group_mean`, or `leave_one_out`: the mean of the OTHER samples, RLOO), divided
    by the group's unbiased std (Bessel's correction, as verl and TRL) when `normalize_by_std`."""
    r = np.asarray(rewards, dtype=np.float64)
    adv = r - BASELINES[baseline](r)
    if normalize_by_std and len(r) > 1:
        adv = adv / (r.std(ddof=1) + eps)
    return adv.tolist()


BASELINES = {
    "group_mean": lambda r: r.mean(),
    "leave_one_out": lambda r: (r.sum() - r) / max(len(r) - 1, 1),
}


def by_group(trajs: list[Trajectory]) -> dict[int, list[Trajectory]]:
    """The samples of each prompt (its group), in order."""
    groups = defaultdict(list)
    for t in trajs:
        groups[t.group_id].append(t)
    return groups


class GRPO(Algorithm):
    reads = ("algorithm.grpo",)

    @property
    def needs_reference(self) -> bool:
        return self.cfg.grpo.kl_coef > 0

    def prepare(self, trajs):
        groups = by_group(trajs)
        kept, skipped = [], 0
        for members in groups.values():
            rewards = [t.reward for t in members]
            if max(rewards) - min(rewards) < 1e-9:
                skipped += 1  # no signal: every advantage would be zero
                continue
            g = self.cfg.grpo
            for t, a in zip(members, group_advantages(rewards, g.normalize_adv_by_std, g.baseline)):
                t.advantages = per_token(a, t.loss_mask)
                kept.append(t)
        return kept, {"grpo/zero_variance_groups": float(skipped), "grpo/groups": float(len(groups)),
                      "grpo/trained_samples": float(len(kept))}

    def token_loss(self, batch, logp_BT, old_logp_BT, ref_logp_BT, student_topm_BTM=None):
        g = self.cfg.grpo
        loss, clipped = clipped_pg(logp_BT, old_logp_BT, batch["advantages"], g.eps_low, g.eps_high)
        metrics = {"actor/clipfrac": clipped, "actor/ratio": (logp_BT - old_logp_BT).detach().exp()}
        if ref_logp_BT is not None:
            kl = k3_kl(logp_BT, ref_logp_BT)
            loss = loss + g.kl_coef * kl
            metrics["actor/ref_kl"] = kl.detach()
        return loss, metrics
