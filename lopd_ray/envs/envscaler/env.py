"""`envscaler`: multi-turn tool use on EnvScaler-format environments.

The agent calls tools by writing `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (several per message
allowed; JSON only, nothing is ever evaluated). Each call's result comes back as one `tool` message holding JSON.
A malformed call, an unknown tool or bad arguments is an error result, never a crash. The episode ends when the
agent answers without a tool call, or after `max_turns` agent messages; the reward is then the fraction of the
scenario's checks that the final state passes.
"""
from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from lopd_ray.errors import ConfigError
from lopd_ray.envs.base import Env, StepResult, Task, TaskList, TaskSource
from lopd_ray.envs.envscaler.core import Catalog, EnvSpec, Scenario, ToolRuntime, run_oracle, score
from lopd_ray.envs.envscaler.loader import load_catalog
from lopd_ray.envs.tool_parsers import PARSERS, get_parser

OBSERVATION_ROLE = "tool"
TEST_SHARE = 0.2
CALL_FORMAT = '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>'


@dataclass
class ParsedCall:
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None        # set when the text could not be read as a call


def parse_calls(parser_name: str, text: str) -> list[ParsedCall]:
    """Calls read by the shared parser registry; a message that could not be parsed is one error result."""
    parsed = get_parser(parser_name).parse(text)
    return [ParsedCall(c.name, c.kwargs) for c in parsed.calls] + [ParsedCall(error=e) for e in parsed.errors]




def json_listing(function: dict[str, Any]) -> str:
    return json.dumps(function, separators=(",", ":"))


def signature_listing(function: dict[str, Any]) -> str:
    """`name(param: type, optional?: a|b): description`."""
    schema = function.get("parameters", {})
    required = set(schema.get("required", []))
    def kind(p: dict[str, Any]) -> str:
        return "|".join(map(str, p["enum"])) if "enum" in p else p.get("type", "any")

    params = [f"{name}{'' if name in required else '?'}: {kind(p)}" for name, p in schema.get("properties", {}).items()]
    return f"{function['name']}({', '.join(params)}): {function.get('description', '')}"


TOOL_LISTINGS: dict[str, Callable[[dict[str, Any]], str]] = {"json": json_listing, "signatures": signature_listing}


def system_prompt(spec: EnvSpec, tool_listing: str = "json") -> str:
    rules = "".join(f"- {rule}\n" for rule in spec.rules)
    tools = "\n".join(TOOL_LISTINGS[tool_listing](t["function"]) for t in spec.tools)
    return (f"# Environment\n{spec.introduction}\n\n## Rules\n{rules}\n## Tools\n{tools}\n\n"
            f"To call a tool, write {CALL_FORMAT}; you may make several calls in one message. Each result comes "
            f"back as JSON. When the task is done, reply with a short summary and no tool call: that ends the "
            f"episode.")


def format_call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class EnvScalerEnv(Env):
    """One scenario per episode; the Task carries its EnvSpec and Scenario in `meta`."""

    def __init__(self, max_turns: int, tool_parser: str):
        super().__init__(max_turns)
        self.tool_parser = tool_parser

    def reset(self, task: Task) -> None:
        self.spec: EnvSpec = task.meta["spec"]
        self.scenario: Scenario = task.meta["scenario"]
        self.runtime = ToolRuntime(self.spec, self.scenario.init_config)
        self.initial = self.runtime.state()
        self.turns = self.tool_calls = self.tool_errors = 0

    def syntax_mask(self, action_text):
        return get_parser(self.tool_parser).syntax(action_text)

    def step(self, action_text: str) -> StepResult:
        self.turns += 1
        calls = parse_calls(self.tool_parser, action_text)
        results = [self._execute(call) for call in calls]
        if not calls or self.turns >= self.max_turns:
            return self._finish("answer" if not calls else "max_turns")
        return StepResult(done=False, observation=[{"role": OBSERVATION_ROLE, "content": json.dumps(r)}
                                                   for r in results])

    def _execute(self, call: ParsedCall) -> dict[str, Any]:
        self.tool_calls += 1
        if call.error:
            result = {"success": False, "error": f"malformed tool call: {call.error}. Use {CALL_FORMAT}"}
        else:
            result = self.runtime.execute(call.name, call.arguments)
        self.tool_errors += result.get("success") is False
        return result

    def _finish(self, ended_by: str) -> StepResult:
        checks = self.scenario.checks
        passed = score(checks, self.initial, self.runtime.state())
        info = {"envscaler/env": self.spec.name, "envscaler/checks_passed": passed,
                "envscaler/checks_total": len(checks), "envscaler/tool_calls": self.tool_calls,
                "envscaler/tool_errors": self.tool_errors, "envscaler/ended_by": ended_by}
        return StepResult(done=True, reward=passed / len(checks) if checks else 0.0, info=info)


class EnvScalerTasks(TaskList):
    def __init__(self, catalog: Catalog, scenarios: list[Scenario], tool_listing: str = "json"):
        self.catalog, self.scenarios = catalog, scenarios
        prompts = {name: system_prompt(spec, tool_listing) for name, spec in catalog.envs.items()}
        self.tasks = [Task(task_id=f"envscaler/{s.scenario_id}",
                           messages=[{"role": "system", "content": prompts[s.env_name]},
                                     {"role": "user", "content": s.task}],
                           meta={"spec": catalog.envs[s.env_name], "scenario": s}) for s in scenarios]

    def reference_solution(self, index: int) -> Optional[str]:
        """The oracle's calls with every reference resolved, in one message, then a closing line."""
        scenario = self.scenarios[index]
        if not scenario.oracle:
            return None
        calls, _, _ = run_oracle(self.catalog.envs[scenario.env_name], scenario)
        return "\n".join(format_call(c["name"], c["arguments"]) for c in calls) + "\nDone."


def held_out_ids(catalog: Catalog) -> set[str]:
    """About TEST_SHARE of every environment's scenarios (seeded by the environment's name), chosen by task text:
    scenarios that share a text (the same request on other data) are all in one split, so no text is in both."""
    chosen: set[str] = set()
    for name in catalog.envs:
        by_text: dict[str, list[str]] = {}
        for s in sorted(catalog.scenarios, key=lambda s: s.scenario_id):
            if s.env_name == name:
                by_text.setdefault(s.task, []).append(s.scenario_id)
        texts = sorted(by_text)
        random.Random(f"envscaler-split/{name}").shuffle(texts)
        wanted, taken = round(sum(map(len, by_text.values())) * TEST_SHARE), 0
        for text in texts:
            if taken >= wanted:
                break
            chosen.update(by_text[text])
            taken += len(by_text[text])
    return chosen


SPLITS: dict[str, Callable[[Scenario, set[str]], bool]] = {
    "train": lambda s, test: s.scenario_id not in test,
    "test": lambda s, test: s.scenario_id in test,
}


def split_scenarios(catalog: Catalog, split: str) -> list[Scenario]:
    """The split's scenarios, interleaved across environments so that a `limit` still covers every domain."""
    if split not in SPLITS:
        raise ConfigError(f"env.split='{split}': envscaler has the splits {sorted(SPLITS)}")
    test = held_out_ids(catalog)
    per_env = [[s for s in catalog.scenarios if s.env_name == name and SPLITS[split](s, test)]
               for name in catalog.envs]
    longest = max((len(group) for group in per_env), default=0)
    return [group[i] for i in range(longest) for group in per_env if i < len(group)]


def make_envscaler(env_cfg, own) -> tuple[Callable[[], Env], TaskSource]:
    if own.max_turns < 2:
        raise ConfigError(f"env.envscaler.max_turns={own.max_turns}: envscaler episodes need tool calls and a final "
                          f"answer; set env.envscaler.max_turns=16 (the longest oracle has about 10 calls)")
    if own.tool_listing not in TOOL_LISTINGS:
        raise ConfigError(f"env.envscaler.tool_listing='{own.tool_listing}' must be one of {sorted(TOOL_LISTINGS)}")
    if own.tool_parser not in PARSERS:
        raise ConfigError(f"env.envscaler.tool_parser='{own.tool_parser}' is not registered: choose one of "
                          f"{sorted(PARSERS)}")
    catalog = load_catalog(env_cfg.data_dir)
    names = [n.strip() for n in own.subset.split(",") if n.strip()]
    if names:
        try:
            catalog = catalog.restrict(names)
        except ValueError as exc:
            raise ConfigError(f"env.envscaler.subset='{own.subset}': {exc}") from None
    scenarios = split_scenarios(catalog, env_cfg.split)
    if env_cfg.limit:
        scenarios = scenarios[:env_cfg.limit]
    return (functools.partial(EnvScalerEnv, own.max_turns, own.tool_parser),
            EnvScalerTasks(catalog, scenarios, own.tool_listing))
