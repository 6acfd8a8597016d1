"""Reward-weighted self-distillation, CONTRIBUTING.md's first worked example: OPSD's teacher, each sample's
distillation weight max(floor, 1 - reward), so that failures learn from the teacher in full."""
from __future__ import annotations

from lopd_ray.algorithms.distill import Distill


class RewardWeighted(Distill):
    reads = Distill.reads + ("algorithm.reward_weighted",)  # a key of this section under another method: an error

    def prepare(self, trajs):
        kept, stats = super().prepare(trajs)
        floor = self.cfg.reward_weighted.floor
        for t in kept:
            weight = max(floor, 1.0 - t.reward)
            t.distill_weights = (t.distill_weights if t.distill_weights is not None else t.loss_mask) * weight
        stats["reward_weighted/weight_mean"] = sum(max(floor, 1.0 - t.reward) for t in kept) / max(len(kept), 1)
        return kept, stats
