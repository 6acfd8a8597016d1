"""`rules_tool`: the `rules` testbed as multi-turn tool use, where the answer needs a value only a tool call returns.

"Apply the zorp rule to: b d a c." The agent first calls the rule's tool, named by the rule's hidden tag, on the
input: "#6 b d a c" (the answer of `rules`). The tool replies "Result: e f a", a code that depends on the tag called
and on the input; the agent then answers with the code. The reward is an exact match of the answer with the code of
the right tag and the task's input, so it needs both the hidden procedure (which tool to call) and the tool's reply:
the model alone can only guess the tag (about 1 in len(TAGS)); a solved task of the same kind shows the call, never
the current task's code; another kind's call returns another code, so it misleads.

Tasks, kinds, tags and splits are those of `rules` (the same task texts).
"""
from __future__ import annotations

import hashlib
import re
from typing import Callable

from lopd_ray.envs.base import Env, StepResult, Task, TaskList, TaskSource
from lopd_ray.envs.rules import INPUT_LETTERS, RulesTasks, normalized, rule_tags

CODE_LENGTH = 3
OBSERVATION_ROLE = "tool"
CALL = re.compile(r"#(\d) ([a-z](?: [a-z])*)")


def tool_code(tag: str, letters: str) -> str:
    """The tool's reply to a call of tag `tag` on `letters`: CODE_LENGTH letters of INPUT_LETTERS, spaced."""
    digest = hashlib.sha256(f"{tag}|{letters}".encode()).digest()
    return " ".join(INPUT_LETTERS[b % len(INPUT_LETTERS)] for b in digest[:CODE_LENGTH])


def tool_reply(call_text: str) -> str:
    """What the tool says to an agent's first message: the code of the called tag and letters, or how to call."""
    call = CALL.fullmatch(normalized(call_text))
    if call is None:
        return "Result: none (call the rule's tool as #<tag> <letters>)"
    return f"Result: {tool_code(call.group(1), call.group(2).replace(' ', ''))}"


class RulesToolTasks(TaskList):
    """The tasks of `rules` with the code of the right call as their answer; the reference solution is the call
    (the procedure; the code comes from the tool)."""

    def __init__(self, num_tasks: int, split: str):
        tags = rule_tags()
        self.tasks = []
        for task in RulesTasks(num_tasks, split).tasks:
            tag, letters = tags[task.meta["kind"]], task.meta["letters"]
            meta = {**task.meta, "call": task.meta["answer"], "answer": tool_code(tag, letters)}
            self.tasks.append(Task(task_id=task.task_id.replace("rules/", "rules_tool/", 1),
                                   messages=task.messages, meta=meta))

    def reference_solution(self, index: int) -> str:
        return self.tasks[index].meta["call"]


class RulesToolEnv(Env):
    """Two agent messages: the call, then the answer."""

    def __init__(self):
        super().__init__(max_turns=2)

    def reset(self, task: Task) -> None:
        self.task, self.called = task, False

    def step(self, action_text: str) -> StepResult:
        if not self.called:
            self.called = True
            return StepResult(done=False, observation=[{"role": OBSERVATION_ROLE, "content": tool_reply(action_text)}])
        return StepResult(done=True, reward=float(normalized(action_text) == self.task.meta["answer"]))


def make_rules_tool(env_cfg, own) -> tuple[Callable[[], Env], TaskSource]:
    return RulesToolEnv, RulesToolTasks(env_cfg.limit or own.num_tasks, env_cfg.split)
