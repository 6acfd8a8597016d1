"""`letters`: the built-in single-turn task family with a verifiable reward.

"Reply with the letter 'b' repeated 6 times." The reward is dense so that a tiny random model learns it on CPU in
minutes: coverage (how many of the asked letters appear, capped) times purity (the share of the answer's visible
characters that are the asked letter). "bbbbbb" scores 1.0; an empty or unrelated answer scores 0.

The family has 10 distinct prompts (2 letters x 5 counts by default), all in any split of 256 tasks, so it has no
held-out split: `train` is its only split. The `rules` env is the held-out testbed.
"""
from __future__ import annotations

import random
from typing import Callable

from lopd_ray.envs.base import Env, StepResult, Task, TaskList, TaskSource
from lopd_ray.errors import ConfigError


def letters_reward(text: str, letter: str, count: int) -> float:
    visible = [ch for ch in text if not ch.isspace()]
    if not visible:
        return 0.0
    hits = sum(ch == letter for ch in visible)
    return min(hits, count) / count * hits / len(visible)


class LettersTasks(TaskList):
    def __init__(self, alphabet: str, min_count: int, max_count: int, num_tasks: int, split: str):
        if split != "train":
            raise ConfigError(f"letters has no held-out split (split '{split}' would repeat train's few prompts): "
                              f"use env.split=train (eval.split=train), or env.name=rules for a held-out split")
        rng = random.Random(f"letters/{split}")
        self.tasks = []
        for i in range(num_tasks):
            letter, count = rng.choice(alphabet), rng.randint(min_count, max_count)
            text = f"Reply with the letter '{letter}' repeated {count} times."
            self.tasks.append(Task(task_id=f"letters/{split}/{i}", messages=[{"role": "user", "content": text}],
                                   meta={"letter": letter, "count": count}))

    def reference_solution(self, index: int) -> str:
        meta = self.tasks[index].meta
        return meta["letter"] * meta["count"]


class LettersEnv(Env):
    def __init__(self):
        super().__init__(max_turns=1)

    def reset(self, task: Task) -> None:
        self.task = task

    def step(self, action_text: str) -> StepResult:
        meta = self.task.meta
        return StepResult(done=True, reward=letters_reward(action_text, meta["letter"], meta["count"]))


def make_letters(env_cfg, own) -> tuple[Callable[[], Env], TaskSource]:
    return LettersEnv, LettersTasks(own.alphabet, own.min_count, own.max_count, own.num_tasks, env_cfg.split)
