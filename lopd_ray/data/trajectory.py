"""The one record that flows from rollout to learner: ragged per-token arrays, never padded, never re-tokenized.

Per-token fields are numpy arrays aligned with `response_ids` (R tokens): the rollout's, then one per signal
declared in lopd_ray/data/signals.py. Lists given to the constructor are converted, so every stage sees the same
dtypes."""
from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Any, Optional

import numpy as np

from lopd_ray.data.signals import SIGNALS

# field -> dtype of the per-token arrays (None stays None): the rollout's and the declared signals'.
TOKEN_ARRAYS = {"prompt_ids": np.int64, "response_ids": np.int64, "loss_mask": np.int32,
                "rollout_logprobs": np.float32, "token_classes": np.int8,
                **{name: signal.dtype for name, signal in SIGNALS.items()}}


@dataclass
class TeacherContext:
    """The privileged context a context provider gives the teacher for one trajectory."""
    text: str
    # "user_prefix" / "user_suffix": before / after the first user message's content; "system": appended to the
    # system message (one is added when the conversation has none).
    placement: str = "user_suffix"


@dataclass(eq=False)  # compared by identity: fields hold arrays
class TrajectoryCore:
    """The fields every trajectory has; Trajectory adds one optional field per declared signal
    (lopd_ray/data/signals.py)."""
    task_id: str
    group_id: int
    prompt_ids: np.ndarray                  # [P]
    # All turns after the prompt, exactly as the engine produced them plus appended observation tokens.
    response_ids: np.ndarray                # [R]
    # 1 on model-generated tokens, 0 on observation / tool tokens.
    loss_mask: np.ndarray                   # [R]
    # (start, end) offsets into response_ids of each model turn.
    turn_spans: list[tuple[int, int]]
    # The engine's log-prob of each sampled token (0.0 where loss_mask is 0): the processed distribution the engine
    # sampled from, i.e. after temperature AND the rollout's top-k/top-p filters (see RolloutWorker).
    rollout_logprobs: np.ndarray            # [R]
    policy_version: int
    reward: float = 0.0
    # Set by the rollout worker.
    task_index: int = -1
    task_text: str = ""                     # the first user message: the bank's query and document
    action_texts: list[str] = field(default_factory=list)
    observation_texts: list[str] = field(default_factory=list)
    truncated: bool = False                 # the last turn hit rollout.max_new_tokens, or the context was full
    context_full: bool = False              # it ended because its next turn would not fit rollout.max_model_len
    observations_cut: int = 0               # env replies cut to rollout.max_observation_chars
    max_turn_tokens: int = 0                # the per-turn token cap it was sampled with
    # [R] 1 on tool-call syntax, 0 on content, -1 where the env cannot tell (and on observation tokens).
    token_classes: Optional[np.ndarray] = None
    info: dict[str, Any] = field(default_factory=dict)  # the env's own verdict fields (rollout dumps, eval)
    # Why the episode failed after every attempt (an env or engine exception); None: it did not. It never trains.
    error: Optional[str] = None
    attempts: int = 1
    # Set by the controller: the trajectory's position in its step.
    uid: int = -1
    # Filled by later stages.
    teacher_context: Optional[TeacherContext] = None        # None: the teacher has no context for it (no signal)
    # A provider with graded contexts: USD's reveal levels, weakest first, the last one teacher_context.
    context_levels: Optional[list[TeacherContext]] = None
    retrieved_ids: Optional[list[str]] = None
    retrieved_texts: Optional[list[str]] = None             # the composer's input per retrieved entry
    # The signals that travel by reference reach the actors that use them as the object references of the blobs
    # that hold them (lopd_ray/data/by_reference.py); the driver sees those fields as None. Set by the controller:
    # the object the rollout worker returned this trajectory in, and its position there.
    array_refs: list = field(default_factory=list)
    rollout_ref: Optional[tuple[Any, int]] = None

    def __post_init__(self) -> None:
        for name, dtype in TOKEN_ARRAYS.items():
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, np.asarray(value, dtype=dtype))

    @property
    def num_action_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_turns(self) -> int:
        return len(self.turn_spans)

    @property
    def longest_turn_tokens(self) -> int:
        return max((end - start for start, end in self.turn_spans), default=0)

    @property
    def token_ids(self) -> np.ndarray:
        """The whole sequence: prompt, then response."""
        return np.concatenate([self.prompt_ids, self.response_ids])


Trajectory = make_dataclass("Trajectory", [(name, Optional[np.ndarray], None) for name in SIGNALS],
                            bases=(TrajectoryCore,), eq=False)
Trajectory.__module__ = __name__  # pickled by reference, like any class of this module
