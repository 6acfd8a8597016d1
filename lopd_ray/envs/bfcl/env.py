"""`bfcl_multiturn`: BFCL v4 multi-turn function calling (base, miss_func, miss_param, long_context).

An episode walks through the task's user turns. Each agent message is parsed for calls with the configured parser
(`env.bfcl_multiturn.tool_parser`: "python_calls" or "json_tag"). A message with calls has them executed on the
task's simulator instances, and the results come back as `tool` messages (one per call, in order); a malformed call
gets one `tool` message with the error and runs nothing. A message without calls ends the current user turn and the
next user question comes (for a miss_func holdout turn: the added function docs). After the last user turn, or when
`env.bfcl_multiturn.max_turns` model steps are spent, BFCL's multi-turn check (lopd_ray.envs.bfcl.checker) scores
the calls: reward 1.0 iff it passes, else 0.0; `info["explanations"]` says why it failed.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

from lopd_ray.envs.base import Env, StepResult, Task, TaskSource
from lopd_ray.envs.bfcl.calls import API_MODULES, Call, ToolRuntime, api_class, get_parser
from lopd_ray.envs.bfcl.checker import check_multi_turn, ground_truth_calls
from lopd_ray.envs.bfcl.data import (BfclTaskSpec, bfcl_dir, load_func_docs, load_specs, opening_messages,
                                     parse_categories, turn_messages)


class BfclMultiTurnTasks(TaskSource):
    """Tasks of the chosen categories, interleaved round-robin (base_0, miss_func_0, ..., base_1, ...) so that
    `env.limit` keeps a mix of categories. BFCL has no train/test split: `env.split` is not applied."""

    def __init__(self, specs: list[BfclTaskSpec], tool_parser: str):
        get_parser(tool_parser)
        self.specs = specs
        self.tool_parser = tool_parser

    @classmethod
    def from_config(cls, env_cfg, own) -> "BfclMultiTurnTasks":
        root = bfcl_dir(env_cfg)
        docs = load_func_docs(root)
        per_category = [load_specs(root, c, docs) for c in parse_categories(own.subset)]
        specs = [s for row in _round_robin(per_category) for s in row]
        if env_cfg.limit and env_cfg.limit > 0:
            specs = specs[:env_cfg.limit]
        return cls(specs, own.tool_parser)

    def __len__(self) -> int:
        return len(self.specs)

    def __getitem__(self, index: int) -> Task:
        spec = self.specs[index]
        meta = spec.to_meta()
        meta["tool_parser"] = self.tool_parser
        return Task(task_id=f"bfcl/{spec.bfcl_id}", messages=opening_messages(spec, self.tool_parser), meta=meta)

    def reference_solution(self, index: int) -> Optional[str]:
        """The ground-truth calls, one line per user turn, in the configured call format."""
        render = get_parser(self.tool_parser).render
        lines = []
        for turn, calls in enumerate(ground_truth_calls(self.specs[index])):
            lines.append(f"turn {turn + 1}: {render(_keyword_form(calls)) if calls else '(no call)'}")
        return "\n".join(lines)


def _round_robin(rows: list[list]) -> list[list]:
    longest = max((len(r) for r in rows), default=0)
    return [[r[i] for r in rows if i < len(r)] for i in range(longest)]


def _keyword_form(calls: list[Call]) -> list[Call]:
    """Positional ground-truth arguments as keywords (the JSON format has no positional arguments)."""
    out = []
    for call in calls:
        if not call.args:
            out.append(call)
            continue
        for class_name in API_MODULES:
            fn = getattr(api_class(class_name), call.name, None)
            if fn is not None and not call.name.startswith("_"):
                try:
                    bound = inspect.signature(fn).bind(None, *call.args, **call.kwargs).arguments
                except TypeError:
                    out.append(call)
                    break
                bound.pop(next(iter(bound)))          # self
                out.append(Call(call.name, (), dict(bound)))
                break
        else:
            out.append(call)
    return out


class BfclMultiTurnEnv(Env):
    def __init__(self, max_turns: int, tool_parser: str):
        """`max_turns`: model steps over the whole episode; `tool_parser`: for tasks that do not name one."""
        super().__init__(max_turns)
        self.tool_parser = tool_parser

    def reset(self, task: Task) -> None:
        self.spec = BfclTaskSpec.from_meta(task.meta)
        self.parser_name = task.meta.get("tool_parser", self.tool_parser)
        self.parser = get_parser(self.parser_name)
        self.runtime = ToolRuntime(self.spec.involved_classes, self.spec.initial_config, self.spec.long_context)
        self.turn = 0
        self.steps = 0
        self.model_turns: list[list[list[Call]]] = [[]]
        self.num_calls = 0
        self.num_call_errors = 0
        self.final: Optional[StepResult] = None

    def syntax_mask(self, action_text):
        return self.parser.syntax(action_text)

    def step(self, action_text: str) -> StepResult:
        if self.final is not None:
            return self.final
        self.steps += 1
        parsed = self.parser.parse(action_text)
        if parsed.errors:
            self.num_call_errors += 1
            observation = [{"role": "tool", "content": "\n".join(parsed.errors)}]
        elif parsed.calls:
            results = self.runtime.execute_all(parsed.calls)
            self.model_turns[self.turn].append(list(parsed.calls))
            self.num_calls += len(parsed.calls)
            observation = [{"role": "tool", "content": r} for r in results]
        else:                                          # no call: this user turn is over
            self.turn += 1
            if self.turn == len(self.spec.turns):
                return self._finish("")
            if self.steps >= self.max_turns:           # the next question is never asked
                return self._finish(f"max_turns={self.max_turns} model steps were spent before user turn "
                                    f"{self.turn} was asked")
            self.model_turns.append([])
            observation = turn_messages(self.spec, self.turn, self.parser_name)
            return StepResult(done=False, observation=observation, info={"bfcl_user_turn": self.turn})
        if self.steps >= self.max_turns:
            return self._finish(f"max_turns={self.max_turns} model steps were spent during user turn {self.turn}")
        return StepResult(done=False, observation=observation, info={"bfcl_user_turn": self.turn})

    def _finish(self, stop_reason: str) -> StepResult:
        result = check_multi_turn(self.spec, self.model_turns)
        explanations = list(result.explanations)
        if stop_reason and not result.valid:
            explanations.insert(0, stop_reason)
        info = {"explanations": explanations, "bfcl_valid": result.valid, "bfcl_id": self.spec.bfcl_id,
                "bfcl_category": self.spec.category, "bfcl_turns_done": len(self.model_turns),
                "bfcl_turns_total": len(self.spec.turns), "bfcl_num_calls": self.num_calls,
                "bfcl_call_parse_errors": self.num_call_errors}
        self.final = StepResult(done=True, reward=1.0 if result.valid else 0.0, info=info)
        return self.final


def make_bfcl_multiturn(env_cfg, own) -> tuple[Callable[[], Env], TaskSource]:
    """`env.bfcl_multiturn.subset`: comma list of base, miss_func, miss_param, long_context (default all four);
    `env.limit`; `env.bfcl_multiturn.max_turns`: model steps per episode (all user turns together);
    `env.bfcl_multiturn.tool_parser`: python_calls/json_tag."""
    return (functools.partial(BfclMultiTurnEnv, own.max_turns, own.tool_parser),
            BfclMultiTurnTasks.from_config(env_cfg, own))
