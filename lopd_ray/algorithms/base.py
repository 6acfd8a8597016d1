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
    # The learner returns each trajectory's pre-update student log-probs (for the composer update).
    returns_student_logprobs = False

    def __init__(self, cfg):
        self.cfg = cfg  # AlgorithmConfig

    @property
    def needs_reference(self) -> bool:
        return self.cfg.kl_coef > 0

    def prepare(self, trajs: list[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
        """Controller side: returns the trajectories to learn from and metrics."""
        return trajs, {}

    def token_loss(self, batch: dict[str, torch.Tensor], logp_BT: torch.Tensor, old_logp_BT: torch.Tensor,
                   ref_logp_BT: Optional[torch.Tensor], student_topm_BTM: Optional[torch.Tensor] = None,
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Learner side: per-token loss [B, T] and per-token metrics [B, T] (token-averaged by the learner).
        `student_topm_BTM` are the student's log-probs at the teacher's top-M tokens when the batch has them."""
        raise NotImplementedError
