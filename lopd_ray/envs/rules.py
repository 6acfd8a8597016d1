"""`rules`: a task family where experience is necessary and sufficient, the testbed of the method studies.

"Apply the zorp rule to: b d a c." Every task names one of KINDS, a rule whose effect the text never explains: the
answer is the rule's hidden tag digit, then the input letters unchanged ("#6 b d a c"). The model alone cannot know
a rule's tag (it can only guess one of TAGS); one solved task of the same kind shows it; a solved task of another
kind shows another rule's tag, so it misleads. The reward is an exact match (1 or 0): the paper's sparse outcome.

Tasks of one kind differ by their input; the train and test splits share the kinds and are disjoint in task text
(each (kind, input) pair belongs to one split by a hash of its text).
"""
from __future__ import annotations

import hashlib
import itertools
import random
from typing import Callable

from lopd_ray.envs.base import Env, StepResult, Task, TaskList, TaskSource

KINDS = ("zorp", "quix", "blen", "vask", "mirt", "dufa", "krel", "tosh")
# Digits: no framing, task or codename holds one, so a tag in the context stands out (the tiny BPE spells most
# words letter by letter, and a letter tag would hide among them).
TAGS = "12345678"
INPUT_LETTERS = "abcdef"
INPUT_LENGTHS = (3, 4)
TEST_SHARE = 0.2
SPLITS = ("train", "test")


def task_text(rule: str, letters: str) -> str:
    return f"Apply the {rule} rule to: {' '.join(letters)}"


def answer_text(tag: str, letters: str) -> str:
    """"#6 b d a c": the "#" keeps the tag one token wherever the answer is quoted (after a newline or a space)."""
    return f"#{tag} " + " ".join(letters)


def normalized(text: str) -> str:
    return " ".join(text.split())


def rule_tags(seed: str = "rules") -> dict[str, str]:
    """Each kind's hidden tag: a fixed permutation of TAGS, one tag per kind."""
    tags = list(TAGS)
    random.Random(seed).shuffle(tags)
    return dict(zip(KINDS, tags))


def split_of(text: str) -> str:
    """A task text's split: the first byte of its hash decides, so no text is in two splits."""
    return "test" if hashlib.sha256(text.encode()).digest()[0] < 256 * TEST_SHARE else "train"


def all_inputs() -> list[str]:
    return ["".join(p) for n in INPUT_LENGTHS for p in itertools.product(INPUT_LETTERS, repeat=n)]


class RulesTasks(TaskList):
    """`num_tasks` tasks of `split`, the kinds in turn (task i is of kind i mod len(KINDS)), inputs drawn without
    repetition by a fixed seed."""

    def __init__(self, num_tasks: int, split: str):
        if split not in SPLITS:
            raise ValueError(f"env.split='{split}': the rules env has the splits {list(SPLITS)}")
        tags = rule_tags()
        pools = {}
        for rule in KINDS:
            inputs = [x for x in all_inputs() if split_of(task_text(rule, x)) == split]
            random.Random(f"rules/{split}/{rule}").shuffle(inputs)
            pools[rule] = inputs
        self.tasks = []
        for i in range(num_tasks):
            rule = KINDS[i % len(KINDS)]
            letters = pools[rule][i // len(KINDS) % len(pools[rule])]
            self.tasks.append(Task(task_id=f"rules/{split}/{i}",
                                   messages=[{"role": "user", "content": task_text(rule, letters)}],
                                   meta={"kind": rule, "letters": letters, "answer": answer_text(tags[rule], letters)}))

    def reference_solution(self, index: int) -> str:
        return self.tasks[index].meta["answer"]


class RulesEnv(Env):
    def __init__(self):
        super().__init__(max_turns=1)

    def reset(self, task: Task) -> None:
        self.task = task

    def step(self, action_text: str) -> StepResult:
        return StepResult(done=True, reward=float(normalized(action_text) == self.task.meta["answer"]))


def make_rules(env_cfg, own) -> tuple[Callable[[], Env], TaskSource]:
    return RulesEnv, RulesTasks(env_cfg.limit or own.num_tasks, env_cfg.split)
