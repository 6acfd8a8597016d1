"""The `envscaler` env family: the generated suite's contract (an oracle scores 100, a random policy under 20, size,
determinism, splits), the tool-call protocol's error handling, the stats command and the EnvScaler JSON loader."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import env_config
from lopd_ray.config import ConfigError
from lopd_ray.envs.base import StepResult, Task
from lopd_ray.envs import make_env
from lopd_ray.envs.envscaler import build_suite, export_catalog, load_catalog
from lopd_ray.envs.envscaler.core import (
    CodeCheck,
    StateCheck,
    ToolRuntime,
    dependent_calls,
    ref,
    resolve,
    score,
    tool_names,
    tool_spec,
)
from lopd_ray.envs.envscaler.domains.kit import DomainEnv, delete_record, find_by_field, set_fields
from lopd_ray.envs.envscaler.env import OBSERVATION_ROLE, EnvScalerEnv, EnvScalerTasks, format_call, parse_calls
from lopd_ray.envs.envscaler.stats import suite_stats

REPO = Path(__file__).resolve().parents[1]
WORDS = ("alpha", "x", "", "ABC123", "2025-06-15", "/home", "@user", "Ann Lee", "A-01", "suite", "none")


@pytest.fixture(scope="module")
def catalog():
    return build_suite()


@pytest.fixture(scope="module")
def tasks(catalog):
    return EnvScalerTasks(catalog, catalog.scenarios)


@pytest.fixture
def empty_data_dir(tmp_path) -> str:
    """A data root without envscaler/, so make_envscaler uses the generated suite whatever data/ holds."""
    return str(tmp_path)


def new_env(max_turns: int = 24) -> EnvScalerEnv:
    return EnvScalerEnv(max_turns, "json_tag")


def results_of(step: StepResult) -> list[dict]:
    assert all(m["role"] == OBSERVATION_ROLE for m in step.observation)
    return [json.loads(m["content"]) for m in step.observation]


def play_oracle(env: EnvScalerEnv, task: Task, calls: int | None = None) -> StepResult:
    """The scripted oracle policy: one call per turn, references resolved from the observations, then an answer."""
    env.reset(task)
    observed: list[dict] = []
    for call in task.meta["scenario"].oracle[:calls]:
        step = env.step(f"Calling {call.name}.\n{format_call(call.name, resolve(call.arguments, observed))}")
        assert not step.done
        observed += results_of(step)
    return env.step("All done.")


# --------------------------------------------------------------------------------------------------- the suite

def test_oracle_policy_scores_100_on_every_scenario(catalog, tasks):
    env = new_env()
    rewards, failed = [], []
    for index in range(len(tasks)):
        final = play_oracle(env, tasks[index])
        assert final.done and final.info["envscaler/ended_by"] == "answer"
        rewards.append(final.reward)
        if final.reward != 1.0 or final.info["envscaler/tool_errors"]:
            failed.append(tasks[index].task_id)
    assert len(rewards) == len(catalog.scenarios) >= 400
    assert not failed
    assert 100 * sum(rewards) / len(rewards) == 100


def random_value(schema: dict, rng: random.Random):
    if "enum" in schema:
        return rng.choice(schema["enum"])
    makers = {"string": lambda: rng.choice(WORDS) + (str(rng.randint(0, 9999)) if rng.random() < 0.5 else ""),
              "integer": lambda: rng.randint(-3, 60), "number": lambda: rng.uniform(-3, 60),
              "boolean": lambda: rng.random() < 0.5, "array": list, "object": dict}
    return makers[schema["type"]]()


def test_random_policy_scores_under_20(catalog, tasks):
    env, rng = new_env(), random.Random(1234)
    rewards, calls, successes = [], 0, 0
    for index in range(len(tasks)):
        env.reset(tasks[index])
        for _ in range(4):
            spec = rng.choice(env.spec.tools)["function"]
            params = spec["parameters"]
            arguments = {k: random_value(v, rng) for k, v in params["properties"].items()
                         if k in params["required"] or rng.random() < 0.5}
            step = env.step(format_call(spec["name"], arguments))
            calls += 1
            successes += sum(r["success"] for r in results_of(step))
        rewards.append(env.step("Finished.").reward)
    score_100 = 100 * sum(rewards) / len(rewards)
    assert len(rewards) == len(catalog.scenarios)
    assert successes > 0.05 * calls          # the random calls do reach the tools
    print(f"random policy: {score_100:.2f} over {len(rewards)} scenarios, {successes}/{calls} calls succeeded")
    assert score_100 < 20, score_100


def test_suite_size_domains_and_dependencies(catalog):
    assert len(catalog.envs) >= 20
    for name, spec in catalog.envs.items():
        assert 4 <= len(spec.tools) <= 8, name
        assert sum(s.env_name == name for s in catalog.scenarios) >= 20, name
    depths = {s.scenario_id: dependent_calls(s.oracle) for s in catalog.scenarios}
    deep = {s.env_name for s in catalog.scenarios if depths[s.scenario_id] >= 3}
    assert len(deep) >= 15
    assert len({s.task for s in catalog.scenarios}) >= 0.95 * len(catalog.scenarios)


def test_every_check_fails_on_the_initial_state(catalog):
    """A check that passes before the agent acts would be free reward (and would lift the random policy)."""
    for s in catalog.scenarios:
        initial = ToolRuntime(catalog.envs[s.env_name], s.init_config).state()
        assert s.checks and score(s.checks, initial, initial) == 0, s.scenario_id


def test_tool_specs_come_from_annotated_signatures_and_docstrings(catalog):
    for spec in catalog.envs.values():
        for t in spec.tools:
            fn = t["function"]
            assert fn["description"] and fn["parameters"]["type"] == "object"
            for name, prop in fn["parameters"]["properties"].items():
                assert prop["type"] in {"string", "integer", "number", "boolean", "array", "object"}, name
                assert prop["description"], (fn["name"], name)
    find = catalog.envs["bank"].tool("find_accounts")
    assert find["parameters"]["required"] == ["owner"]
    assert find["parameters"]["properties"]["kind"]["enum"] == ["checking", "savings"]
    assert find["parameters"]["properties"]["owner"]["description"] == "full name of the account holder."

    def undocumented(self, x: int) -> int:
        """Does things."""
    with pytest.raises(ValueError, match="no description"):
        tool_spec(undocumented)


class _Shelf(DomainEnv):
    find_box = find_by_field("boxes", "box_id", "Look a box up by label.", "no box labelled '{label}'",
                             label="the label on the box.")
    seal_box = set_fields("boxes", "box", "Seal a box.", "the box.", sealed=True)
    drop_box = delete_record("boxes", "box", "Throw a box away.", "the box.", "dropped")


def test_tools_declared_in_one_line_are_ordinary_tools():
    """`find_by_field`/`set_fields`/`delete_record` become @tool methods named after their attribute: the same
    spec, call forms (keyword or positional) and {"success": ...} results as a written-out method."""
    assert tool_names(_Shelf) == ["find_box", "seal_box", "drop_box"]
    find = tool_spec(_Shelf.find_box)["function"]
    assert find["name"] == "find_box" and find["description"] == "Look a box up by label."
    assert find["parameters"] == {"type": "object", "required": ["label"], "properties": {
        "label": {"type": "string", "description": "the label on the box."}}}
    assert tool_spec(_Shelf.seal_box)["function"]["parameters"]["required"] == ["box_id"]
    shelf = _Shelf({"boxes": {"B1": {"label": "tools", "sealed": False}}, "next_id": 0})
    assert shelf.find_box(label="tools") == {"success": True, "data": {"box_id": "B1", "label": "tools",
                                                                       "sealed": False}}
    assert shelf.find_box("toys") == {"success": False, "error": "no box labelled 'toys'"}
    assert shelf.seal_box("B1") == {"success": True, "data": {"box_id": "B1", "sealed": True}}
    assert shelf.boxes["B1"]["sealed"] is True
    assert shelf.drop_box(box_id="B2") == {"success": False, "error": "unknown box 'B2'"}
    assert shelf.drop_box(box_id="B1") == {"success": True, "data": {"box_id": "B1", "dropped": True}}
    assert shelf.boxes == {}
    with pytest.raises(TypeError):
        shelf.find_box(name="tools")


def test_the_signature_listing_names_every_tool_with_typed_and_optional_parameters(catalog):
    bank = catalog.envs["bank"]
    scenario = next(s for s in catalog.scenarios if s.env_name == "bank")
    prompt = EnvScalerTasks(catalog, [scenario], "signatures")[0].messages[0]["content"]
    assert ("find_accounts(owner: string, kind?: checking|savings): List the accounts of a customer.\n"
            "get_balance(account_id: string): Current balance of an account.\n") in prompt
    assert all(f"\n{t['function']['name']}(" in prompt for t in bank.tools)
    json_prompt = EnvScalerTasks(catalog, [scenario])[0].messages[0]["content"]
    assert '"parameters"' not in prompt and '"parameters"' in json_prompt
    with pytest.raises(ConfigError, match="env.envscaler.tool_listing='xml' must be one of"):
        make_env(env_config("envscaler", tool_listing="xml"))


def test_generation_is_deterministic_across_runs_and_hash_seeds(catalog, tmp_path):
    export_catalog(catalog, tmp_path / "a")
    export_catalog(build_suite(), tmp_path / "b")
    code = ("import sys; from lopd_ray.envs.envscaler import build_suite, export_catalog; "
            "export_catalog(build_suite(), sys.argv[1])")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "c")], cwd=REPO, check=True,
                   env={**os.environ, "PYTHONHASHSEED": "4321", "OMP_NUM_THREADS": "1"})
    for name in ("env_metadata.json", "scenarios.json"):
        first = (tmp_path / "a" / name).read_text()
        assert first == (tmp_path / "b" / name).read_text() == (tmp_path / "c" / name).read_text()
    assert catalog.scenarios[0].task != catalog.scenarios[1].task


# ------------------------------------------------------------------------------------------- the tool protocol

def test_malformed_unknown_and_bad_argument_calls_are_error_observations(tasks):
    env = new_env()
    task = next(t for t in tasks.tasks if t.task_id == "envscaler/bank-000")
    env.reset(task)
    some_id = next(iter(env.initial["accounts"]))
    cases = {
        "<tool_call>{not json}</tool_call>": "invalid JSON in <tool_call>",
        '<tool_call>["transfer"]</tool_call>': "must hold a JSON object",
        '<tool_call>{"name": "deposit", "arguments": [1, 2]}</tool_call>': "must be a JSON object",
        # An unclosed tag is read up to the end of the message (models often stop on the tag's first token).
        'Let me call <tool_call>{"name": "deposit", "arguments": {}}': "missing required argument(s) ['account_id', 'amount']",
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>': "unknown tool 'rm_rf'",
        format_call("deposit", {"account_id": some_id}): "missing required argument(s) ['amount']",
        format_call("deposit", {"account_id": some_id, "amount": "ten"}): "argument 'amount': expected integer",
        format_call("deposit", {"account_id": some_id, "amount": True}): "argument 'amount': expected integer",
        format_call("deposit", {"account_id": some_id, "amount": 5, "note": "x"}): "unexpected argument(s) ['note']",
        format_call("find_accounts", {"owner": "x", "kind": "gold"}): "must be one of ['checking', 'savings']",
        format_call("deposit", {"account_id": "AC0000", "amount": 5}): "unknown account 'AC0000'",
        format_call("deposit", {"account_id": some_id, "amount": -5}): "positive whole number",
    }
    for text, message in cases.items():
        step = env.step(text)
        assert not step.done, text
        [result] = results_of(step)
        assert result["success"] is False and message in result["error"], (text, result)
    assert env.runtime.state() == env.initial
    # The episode goes on: the oracle still solves the task, and the errors are counted.
    final = play_oracle(env, task)
    assert final.reward == 1.0
    env.reset(task)
    for text in cases:
        env.step(text)
    assert env.step("I give up.").info["envscaler/tool_errors"] == len(cases)


def test_several_calls_per_message_and_string_arguments():
    calls = parse_calls("json_tag", 'a <tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call> b '
                           '<tool_call>{"name": "g"}</tool_call>')
    assert [(c.name, c.arguments, c.error) for c in calls] == [("f", {"x": 1}, None), ("g", {}, None)]
    assert parse_calls("json_tag", "no call here, just an answer") == []


def test_reward_is_the_fraction_of_checks_passed(tasks):
    env = new_env()
    task = next(t for t in tasks.tasks if t.task_id == "envscaler/bank-001")   # deposit, then freeze
    assert len(task.meta["scenario"].checks) == 2
    half = play_oracle(env, task, calls=2)
    assert half.done and half.reward == 0.5 and half.info["envscaler/checks_passed"] == 1
    env.reset(task)
    assert env.step("Nothing to do.").reward == 0.0


def test_max_turns_ends_the_episode_with_its_reward(tasks):
    env = new_env(max_turns=2)
    for index in range(len(tasks)):
        env.reset(tasks[index])
        first = env.step(format_call("no_such_tool", {}))
        assert not first.done
        last = env.step(tasks.reference_solution(index))   # all resolved calls in one message
        assert last.done and last.info["envscaler/ended_by"] == "max_turns"
        assert last.reward == 1.0, tasks[index].task_id


# -------------------------------------------------------------------------------------- factory and splits

def test_splits_are_disjoint_cover_everything_and_are_per_environment(catalog, empty_data_dir):
    env_cls, train = make_env(env_config("envscaler", split="train", max_turns=12, data_dir=empty_data_dir))
    _, test = make_env(env_config("envscaler", split="test", max_turns=12, data_dir=empty_data_dir))
    _, train_again = make_env(env_config("envscaler", split="train", max_turns=12,
                                              data_dir=empty_data_dir))
    train_ids, test_ids = [t.task_id for t in train.tasks], [t.task_id for t in test.tasks]
    assert set(train_ids).isdisjoint(test_ids)
    assert set(train_ids) | set(test_ids) == {f"envscaler/{s.scenario_id}" for s in catalog.scenarios}
    assert train_ids == [t.task_id for t in train_again.tasks]
    assert not {t.user_text for t in train.tasks} & {t.user_text for t in test.tasks}
    for name in catalog.envs:
        held_out = sum(t.meta["scenario"].env_name == name for t in test.tasks)
        total = sum(s.env_name == name for s in catalog.scenarios)
        assert abs(held_out - 0.2 * total) <= 0.1 * total, name  # whole groups of scenarios that share a text
    assert env_cls().max_turns == 12 and isinstance(env_cls(), EnvScalerEnv)
    assert train.tasks[0].messages[0]["role"] == "system" and "<tool_call>" in train.tasks[0].messages[0]["content"]


def test_subset_limit_and_config_errors(empty_data_dir):
    def make(**overrides):
        return make_env(env_config("envscaler", **{"max_turns": 8, "data_dir": empty_data_dir, **overrides}))[1]

    subset = make(subset="bank, gym")
    assert {t.meta["scenario"].env_name for t in subset.tasks} == {"bank", "gym"}
    limited = make(limit=25)
    assert len(limited) == 25
    assert len({t.meta["scenario"].env_name for t in limited.tasks[:20]}) == 20     # interleaved
    for bad in ({"subset": "bank,casino"}, {"split": "dev"}, {"max_turns": 1}, {"tool_parser": "xml"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            make(**bad)


# ------------------------------------------------------------------------------------------------ stats

def test_stats_command_prints_the_suite_numbers(catalog, empty_data_dir):
    out = subprocess.run([sys.executable, "-m", "lopd_ray.envs.envscaler.stats", "--data-dir", empty_data_dir],
                         cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    stats = suite_stats(catalog)
    assert int(lines["environments"]) == stats["environments"] >= 20
    assert lines["scenarios"] == f"{stats['scenarios']} (train {stats['train']}, test {stats['test']})"
    assert int(lines["tools"].split()[0]) == stats["tools"]
    assert float(lines["mean checks per scenario"]) == pytest.approx(stats["mean_checks"], abs=0.005)
    assert float(lines["mean oracle calls per scenario"].split()[0]) == pytest.approx(stats["mean_oracle_calls"],
                                                                                     abs=0.005)
    share = float(lines["scenarios with 3+ dependent calls"].rstrip("%"))
    assert share == pytest.approx(100 * stats["dependent3_share"], abs=0.05) and share > 0
    assert all(name in out for name in catalog.envs)


# ----------------------------------------------------------------------------------------------- loader

def test_loader_round_trips_exported_scenarios(catalog, tmp_path):
    part = catalog.restrict(["bank", "email", "recipes"])
    export_catalog(part, tmp_path / "envscaler")
    loaded = load_catalog(str(tmp_path))
    assert loaded.origin.startswith("json:") and list(loaded.envs) == list(part.envs)
    assert [spec.tools for spec in loaded.envs.values()] == [spec.tools for spec in part.envs.values()]
    for a, b in zip(part.scenarios, loaded.scenarios, strict=True):
        assert (a.scenario_id, a.env_name, a.task, a.init_config) == (b.scenario_id, b.env_name, b.task,
                                                                      b.init_config)
        assert a.oracle == b.oracle and a.checks == b.checks
    _, json_tasks = make_env(env_config("envscaler", split="test", max_turns=12, data_dir=str(tmp_path)))
    assert len(json_tasks) == round(0.2 * len(part.scenarios))
    assert all(play_oracle(new_env(), t).reward == 1.0 for t in json_tasks.tasks)

    # Without the declarative copy, the EnvScaler-style check_func source gives the same verdicts.
    scenario_file = tmp_path / "envscaler" / "scenarios.json"
    items = json.loads(scenario_file.read_text())
    for item in items:
        for check in item["checklist_with_func"]:
            del check["check"]
    scenario_file.write_text(json.dumps(items))
    code_loaded = load_catalog(str(tmp_path))
    for a, b in zip(part.scenarios, code_loaded.scenarios, strict=True):
        assert all(isinstance(c, CodeCheck) for c in b.checks)
        spec = part.envs[a.env_name]
        initial = ToolRuntime(spec, a.init_config).state()
        env = new_env()
        play_oracle(env, Task("t", [], {"spec": spec, "scenario": a}))
        final = env.runtime.state()
        for x, y in zip(a.checks, b.checks, strict=True):
            assert (x.passes(initial, final), x.passes(initial, initial)) == \
                   (y.passes(initial, final), y.passes(initial, initial)) == (True, False)


ENVSCALER_CLASS = '''
class CounterEnv:
    def __init__(self, config):
        self.count = 0
        self.log = []

    def increment(self, by):
        if by < 1:
            return {"success": False, "error": "by must be positive"}
        self.count += by
        return {"success": True, "count": self.count}

    def note(self, text):
        self.log.append(text)
        return "noted"
'''


def test_loader_reads_envscaler_native_json(tmp_path):
    """An env item with env_class_code and a scenario whose check_func reads initial_state, as EnvScaler ships."""
    tools = [{"type": "function", "function": {"name": "increment", "description": "Add to the counter.",
                                               "parameters": {"type": "object", "properties": {"by": {"type": "int"}},
                                                              "required": ["by"]}}},
             {"type": "function", "function": {"name": "note", "description": "Log a note.",
                                               "parameters": {"type": "object",
                                                              "properties": {"text": {"type": "string"}},
                                                              "required": ["text"]}}}]
    folder = tmp_path / "envscaler"
    folder.mkdir()
    (folder / "191_env_metadata.json").write_text(json.dumps([{
        "env_class_name": "CounterEnv", "environment_introduction": "A counter.", "constraints_rules": ["Be nice."],
        "tools": tools, "env_class_code": ENVSCALER_CLASS}]))
    went_up = "def check_func(final_state):\n    return final_state['count'] == initial_state['count'] + 5"
    checks = [{"check_item": "count went up by 5", "check_func": went_up},
              {"check_item": "a note was logged", "check_func": "def check_func(final_state):\n    return "
                                                                "len(final_state['log']) == 1"},
              {"check_item": "broken check", "check_func": "def check_func(final_state):\n    return 1 / 0"}]
    (folder / "envscaler_rl_scenario_metadata.json").write_text(json.dumps([{
        "task_id": f"t{i}", "env_id": 0, "env_class_name": "CounterEnv", "init_config": {"count": i},
        "task": f"Add 5 to the counter and log a note (ticket {i}).", "checklist_with_func": checks} for i in range(5)]))
    env_cls, source = make_env(env_config("envscaler", split="train", max_turns=6, data_dir=str(tmp_path)))
    assert len(source) == 4 and source.reference_solution(0) is None
    env = env_cls()
    env.reset(source[0])
    start = env.initial["count"]
    step = env.step(format_call("increment", {"by": 2}) + format_call("increment", {"by": 3}) +
                    format_call("note", {"text": "hi"}) + format_call("increment", {"by": "x"}))
    results = results_of(step)
    assert [r["success"] for r in results] == [True, True, True, False]
    assert results[1]["count"] == start + 5 and results[2] == {"success": True, "data": "noted"}
    final = env.step("Done.")
    assert final.reward == pytest.approx(2 / 3)       # the broken check counts as failed, never crashes
    env.reset(source[1])
    assert env.step(format_call("increment", {"by": 5})).done is False
    assert env.step("Done.").reward == pytest.approx(1 / 3)


def test_references_resolve_into_earlier_results():
    results = [{"success": True, "data": [{"id": "A1"}, {"id": "B2"}]}, {"success": True, "data": {"n": 3}}]
    args = {"first": ref(0, 1, "id"), "n": ref(1, "n"), "nested": [ref(0, 0, "id")], "plain": 7}
    assert resolve(args, results) == {"first": "B2", "n": 3, "nested": ["A1"], "plain": 7}
    with pytest.raises(KeyError):
        resolve(ref(0, 5, "id"), results)
    assert StateCheck.from_json({"op": "eq", "path": ["a"], "value": 1}).passes({}, {"a": 1})
