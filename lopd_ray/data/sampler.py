"""Which tasks each step trains on: a seeded permutation per epoch, resumable from its state."""
from __future__ import annotations

import numpy as np


class TaskSampler:
    def __init__(self, num_tasks: int, prompts_per_step: int, seed: int):
        if num_tasks == 0:
            raise ValueError("the environment's split has no tasks: check env.name and env.split")
        self.num_tasks, self.prompts_per_step, self.seed = num_tasks, prompts_per_step, seed
        self.epoch, self.offset = 0, 0

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_tasks)

    def next(self) -> list[int]:
        """The next `prompts_per_step` task indices; an epoch boundary continues into the next permutation."""
        picked = []
        while len(picked) < self.prompts_per_step:
            order = self._order(self.epoch)
            take = order[self.offset:self.offset + self.prompts_per_step - len(picked)]
            picked += take.tolist()
            self.offset += len(take)
            if self.offset >= self.num_tasks:
                self.epoch, self.offset = self.epoch + 1, 0
        return picked

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "num_tasks": self.num_tasks}

    def load_state_dict(self, state: dict) -> None:
        if state["num_tasks"] != self.num_tasks:
            raise ValueError(f"the checkpoint's sampler saw {state['num_tasks']} tasks but the env now has "
                             f"{self.num_tasks}: resume with the same env settings or run.resume=off")
        self.epoch, self.offset = state["epoch"], state["offset"]


def sample_seed(base_seed: int, step: int, slot: int) -> int:
    """A per-sample sampling seed that depends only on (run seed, step, position in the step)."""
    return int(np.random.default_rng([base_seed, step, slot]).integers(0, 2**31 - 1))
