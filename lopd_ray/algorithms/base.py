"""What an algorithm declares: the controller stages it needs, the controller-side preparation of a batch
(advantages, filtering) and the learner-side per-token loss."""
from __future__ import annotations

from typing import Optional

import torch

from lopd_ray.data.trajectory import Trajectory


class Algorithm:
    needs_retrieval = False
    needs_teacher = False
    updates_composer = False

    def __init__(self, cfg):
        self.cfg = cfg  # AlgorithmConfig

    @property
    def needs_reference(self) -> bool:
        return self.cfg.kl_coef > 0

    def prepare(self, trajs: list[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
        """Controller side: returns the trajectories to learn from and metrics."""
        return trajs, {}

    def token_loss(self, batch: dict[str, torch.Tensor], logp_BT: torch.Tensor, old_logp_BT: torch.Tensor,
                   ref_logp_BT: Optional[torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Learner side: per-token loss [B, T] and per-token metrics [B, T] (token-averaged by the learner)."""
        raise NotImplementedError
