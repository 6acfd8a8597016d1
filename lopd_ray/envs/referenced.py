"""Testbeds whose train split shows reference solutions of some kinds only (`env.<name>.referenced_kinds` of the
rules family): the bank's seed, the composer's cold start and an oracle teacher then see those kinds, and what a
teacher knows of the others must be learned during training. The held-out split keeps every kind's."""
from __future__ import annotations

from typing import Callable, Optional

from lopd_ray.envs.base import TaskList, TaskSource
from lopd_ray.envs.rules import KINDS


class ReferencedKinds(TaskList):
    """`tasks` with the reference solutions of tasks outside `kinds` (by `task.meta["kind"]`) hidden."""

    def __init__(self, tasks: TaskSource, kinds: set[str]):
        self.tasks, self.kinds = tasks, kinds

    def reference_solution(self, index: int) -> Optional[str]:
        return self.tasks.reference_solution(index) if self.tasks[index].meta["kind"] in self.kinds else None


def with_referenced_kinds(make: Callable) -> Callable:
    """The env factory `make` whose train split keeps the reference solutions of the first
    env.<name>.referenced_kinds kinds only."""
    def make_env(env_cfg, own):
        new_env, tasks = make(env_cfg, own)
        count = own.referenced_kinds
        if not 1 <= count <= len(KINDS):
            raise ValueError(f"env.{env_cfg.name}.referenced_kinds={count}: give 1 to {len(KINDS)}, the number of "
                             f"kinds whose train tasks show their reference solution")
        if env_cfg.split == "train" and count < len(KINDS):
            tasks = ReferencedKinds(tasks, set(KINDS[:count]))
        return new_env, tasks
    return make_env
