"""What an algorithm declares: the controller stages it needs, the config sections it reads, the controller-side
preparation of a batch (advantages, filtering) and the learner-side per-token loss."""
from __future__ import annotations

import functools
from typing import Mapping, Optional

import numpy as np
import torch

from lopd_ray.algorithms.losses import LOSS_AGGREGATIONS
from lopd_ray.data.signals import writes_of
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.errors import require


class Algorithm:
    needs_teacher = False
    # The context provider (`context.name`) the algorithm works with; None: any.
    required_context: Optional[str] = None
    # Its top-M divergence (a teacher-side step minimizes it); None: it has none.
    divergence = None
    # The learner returns each trajectory's pre-update student log-probs (for the composer update).
    returns_student_logprobs = False
    # Config keys and sections this algorithm reads besides those every run reads (model, env, rollout, learner,
    # ...); a key set to a non-default value under another algorithm's section is a config error.
    reads: tuple[str, ...] = ()
    # Keys of its sections whose values name a registry entry -> that registry.
    choices: dict[str, Mapping] = {"algorithm.loss_agg": LOSS_AGGREGATIONS}
    # After the update the learners re-score the batch, for `update_diagnostics`.
    wants_updated_logprobs = False
    # Extra rollout rounds that may replace the groups `informative` rejects (DAPO's dynamic sampling); 0: none.
    refill_rounds = 0

    def __init__(self, cfg):
        self.cfg = cfg  # AlgorithmConfig

    @classmethod
    def reads_for(cls, cfg) -> tuple[str, ...]:
        """The sections read under this AlgorithmConfig (an option may read another section)."""
        return cls.reads

    @classmethod
    def choices_for(cls, cfg) -> dict[str, Mapping]:
        """The registry keys read under this AlgorithmConfig."""
        return cls.choices

    @classmethod
    def check(cls, cfg, context) -> None:
        """Its checks of the whole Config `cfg` with the provider of `context.name` (`context`), run before any
        actor starts: a ConfigError naming the key and the fix."""
        require(cls.required_context is None or cfg.context.name == cls.required_context,
                f"algorithm.name={cfg.algorithm.name} works with context.name={cls.required_context}, not "
                f"'{cfg.context.name}': set context.name={cls.required_context}")
        for key, table in cls.choices_for(cfg.algorithm).items():
            value = functools.reduce(getattr, key.split("."), cfg)
            require(value in table, f"{key}='{value}' is not registered: choose one of {sorted(table)}")
        require(cfg.algorithm.seq_sum_tokens >= 1,
                f"algorithm.seq_sum_tokens={cfg.algorithm.seq_sum_tokens} must be >= 1")
        require(cls.needs_teacher or not cfg.eval.teacher,
                f"eval.teacher=true scores the teacher on the held-out split, but algorithm.name={cfg.algorithm.name} "
                f"has no teacher: set eval.teacher=false or choose a method with one")

    @property
    def needs_reference(self) -> bool:
        return False

    def scorers(self) -> tuple[str, ...]:
        """The scorers of the teacher's scoring stage, in order (keys of data/signals.SCORERS)."""
        return ()

    def teacher_steps(self) -> tuple[str, ...]:
        """The teacher's own steps after each student update (keys of data/signals.TEACHER_STEPS), in order."""
        return ()

    def teacher_step_args(self, name: str) -> tuple:
        """What the driver passes to the teacher step `name` after its trajectories (a dual variable)."""
        return ()

    def after_teacher_step(self, name: str, metrics: dict[str, float]) -> dict[str, float]:
        """Driver side, from rank 0's metrics of the step `name`: updates the algorithm's state; returns metrics."""
        return {}

    def makes(self, signal: str) -> bool:
        """Whether one of its scorers writes `signal`."""
        return signal in writes_of(self.scorers())

    def learner_temperature(self, cfg) -> float:
        """The temperature of the learner's log-probs in the training step (`cfg` is the whole Config)."""
        return cfg.rollout.temperature

    def state_dict(self) -> dict:
        """Controller-side state a resumed run needs (a dual variable), saved in the controller's checkpoint."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def informative(self, members: list[Trajectory]) -> bool:
        """Whether a group (the samples of one prompt) can teach anything."""
        return True

    def prepare(self, trajs: list[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
        """Controller side: returns the trajectories to learn from and metrics."""
        return trajs, {}

    def complete_targets(self, t: Trajectory) -> None:
        """Learner side, once `t`'s wide arrays are fetched (lopd_ray/data/by_reference.py): the teacher targets
        that `prepare` chose per token from their [R] summaries (USD's levels)."""

    def update_diagnostics(self, trajs: list[Trajectory], updated: list[np.ndarray]) -> dict[str, float]:
        """Metrics of how the update moved the student: `updated` are its log-probs of each trajectory's sampled
        tokens after the update (when `wants_updated_logprobs`)."""
        return {}

    def token_loss(self, batch: dict[str, torch.Tensor], logp_BT: torch.Tensor, old_logp_BT: torch.Tensor,
                   ref_logp_BT: Optional[torch.Tensor], student_topm_BTM: Optional[torch.Tensor] = None,
                   full_divergence_BT: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Learner side: per-token loss [B, T] and per-token metrics [B, T] (token-averaged by the learner).
        `student_topm_BTM` are the student's log-probs at the teacher's top-M tokens when the batch has them;
        `full_divergence_BT` the full-vocabulary divergence from the teacher (when it makes `teacher_hidden`)."""
        raise NotImplementedError


def per_token(value: float, loss_mask: np.ndarray) -> np.ndarray:
    """A per-trajectory value spread over its action tokens (0 on observation tokens), float32."""
    return (value * loss_mask).astype(np.float32)
