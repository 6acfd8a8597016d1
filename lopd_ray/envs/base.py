"""The environment interface. An episode is a conversation: the env opens it, the agent answers, the env
either ends it with a reward or replies with an observation (multi-turn)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Optional


@dataclass
class Task:
    task_id: str
    messages: list[dict[str, str]]          # the opening chat messages (system/user)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def user_text(self) -> str:
        """The first user message: what the bank embeds and retrieves by."""
        return next(m["content"] for m in self.messages if m["role"] == "user")


@dataclass
class StepResult:
    done: bool
    reward: float = 0.0
    observation: list[dict[str, str]] = field(default_factory=list)  # messages appended when not done
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """One env instance runs one episode at a time inside a RolloutWorker; an episode ends after at most
    `max_turns` agent messages. Envs get their settings through the constructor (see `make_env`)."""

    def __init__(self, max_turns: int):
        self.max_turns = max_turns

    @abstractmethod
    def reset(self, task: Task) -> None: ...

    @abstractmethod
    def step(self, action_text: str) -> StepResult: ...

    def syntax_mask(self, action_text: str) -> Optional[list[bool]]:
        """Per character of an agent message: True on tool-call syntax, False on content; None where the env
        cannot tell them apart."""
        return None


class TaskSource(ABC):
    """The tasks of an env's split, addressable by index (the sampler keeps only positions)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __getitem__(self, index: int) -> Task: ...

    def reference_solution(self, index: int) -> Optional[str]:
        """A known-good answer to the task, where the env has one (demonstrations, bank seeding)."""
        return None


class TaskList(TaskSource):
    """A TaskSource over tasks held in `self.tasks` (a list built up front, or another TaskSource)."""

    tasks: list[Task]

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, index: int) -> Task:
        return self.tasks[index]


@dataclass(frozen=True)
class EnvSpec:
    """An env as a run builds it. `make(env_cfg, options)` returns a function that builds an Env and the TaskSource
    of `env_cfg.split`; `options` is the env's own settings: its section `env.<name>` for an env of the registry, an
    instance of the `options` dataclass filled from `env.options` for one named by import path (None without it).
    `reads`: the keys among env.split, env.limit and env.data_dir that `make` reads; setting another is an error."""
    make: Callable[[Any, Any], tuple[Callable[[], Env], TaskSource]]
    options: Optional[type] = None
    reads: tuple[str, ...] = ()
