"""The one record that flows from rollout to learner: ragged token lists, never padded, never re-tokenized."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class Trajectory:
    task_id: str
    group_id: int
    prompt_ids: list[int]
    # All turns after the prompt, exactly as the engine produced them plus appended observation tokens.
    response_ids: list[int]
    # 1 on model-generated tokens, 0 on observation / tool tokens; aligned with response_ids.
    loss_mask: list[int]
    # (start, end) offsets into response_ids of each model turn.
    turn_spans: list[tuple[int, int]]
    # The engine's log-prob of each response token (0.0 where loss_mask is 0).
    rollout_logprobs: list[float]
    policy_version: int
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    # Filled by later stages.
    advantages: Optional[list[float]] = None
    retrieved_ids: Optional[list[str]] = None
    teacher_topm_ids: Optional[list[list[int]]] = None
    teacher_topm_logprobs: Optional[list[list[float]]] = None

    @property
    def num_action_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)
