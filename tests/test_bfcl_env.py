"""`bfcl_multiturn`: ground-truth replay through the env and BFCL's checker, mutated replays, the ast call parser
against code injection, malformed calls, miss_func holdout turns, step budget, config, and the agent loop."""
from __future__ import annotations

import random
import re
import time

import pytest

pytest.importorskip("bfcl_eval", reason="pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0")

from conftest import env_config  # noqa: E402
from lopd_ray.config import EnvConfig  # noqa: E402
from lopd_ray.envs import make_env  # noqa: E402
from lopd_ray.envs.bfcl import PARSERS, Call, check_multi_turn  # noqa: E402
from lopd_ray.envs.bfcl.calls import ERROR_PREFIX, ToolRuntime, parse_json_tag, parse_python_calls  # noqa: E402
from lopd_ray.envs.bfcl.checker import ground_truth_calls  # noqa: E402
from lopd_ray.envs.bfcl.data import ADDITIONAL_FUNCTIONS_PROMPT, BfclDataError, BfclTaskSpec, bfcl_dir  # noqa: E402
from lopd_ray.envs.bfcl.env import _keyword_form  # noqa: E402

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")

if not (bfcl_dir(None) / "BFCL_v4_multi_turn_base.json").is_file():
    pytest.skip(f"BFCL data not found under {bfcl_dir(None)} (set $LOPD_RAY_DATA)", allow_module_level=True)


def _cfg(**kw) -> EnvConfig:
    return env_config("bfcl_multiturn", **{"max_turns": 200, "tool_parser": "python_calls", **kw})


@pytest.fixture(scope="module")
def all_tasks():
    return make_env(_cfg())


def _replay(env_cls, task, turns: list[list[Call]], render) -> tuple:
    """Drives one episode: per user turn one message with that turn's calls (if any), then a plain answer."""
    env = env_cls()
    env.reset(task)
    observations, result = [], None
    for calls in turns:
        if calls:
            result = env.step(render(calls))
            assert not result.done
            observations += [m["content"] for m in result.observation]
        result = env.step("Done with this request.")
    assert result is not None and result.done
    return result, observations


@pytest.mark.parametrize("parser", ["python_calls", "json_tag"])
def test_ground_truth_replays_score_100_percent(parser):
    env_cls, tasks = make_env(_cfg(tool_parser=parser))
    render = PARSERS[parser].render
    counts, passed, failures = {}, {}, []
    start = time.time()
    for i in range(len(tasks)):
        task = tasks[i]
        gt = ground_truth_calls(BfclTaskSpec.from_meta(task.meta))
        if parser == "json_tag":
            gt = [_keyword_form(calls) for calls in gt]
        result, observations = _replay(env_cls, task, gt, render)
        category = task.meta["category"]
        counts[category] = counts.get(category, 0) + 1
        passed[category] = passed.get(category, 0) + int(result.reward == 1.0)
        if result.reward != 1.0 or result.info["explanations"]:
            failures.append((task.task_id, result.info["explanations"]))
        # the ground truth executes without a single simulator error
        assert not [o for o in observations if o.startswith(ERROR_PREFIX)], task.task_id
    print(f"\n{parser}: {passed} of {counts} in {time.time() - start:.1f}s")
    assert counts == {c: 200 for c in CATEGORIES}
    assert not failures, failures[:5]


def _alter(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    if isinstance(value, dict):
        return {**value, "extra": 1}
    return "x"


def _mutate(gt: list[list[Call]], rng: random.Random, mode: str) -> list[list[Call]]:
    turns = [list(t) for t in gt]
    turn = rng.choice([i for i, t in enumerate(turns) if t])
    index = rng.randrange(len(turns[turn]))
    call = turns[turn][index]
    if mode == "remove" or not (call.args or call.kwargs):
        del turns[turn][index]
    elif call.kwargs:
        key = rng.choice(sorted(call.kwargs))
        turns[turn][index] = Call(call.name, call.args, {**call.kwargs, key: _alter(call.kwargs[key])})
    else:
        turns[turn][index] = Call(call.name, (_alter(call.args[0]),) + call.args[1:], {})
    return turns


@pytest.mark.parametrize("mode", ["remove", "alter"])
def test_mutated_replays_fail_with_explanations(all_tasks, mode):
    env_cls, tasks = all_tasks
    rng = random.Random(f"bfcl-{mode}")
    render = PARSERS["python_calls"].render
    rewards = []
    for i in range(len(tasks)):
        task = tasks[i]
        mutated = _mutate(ground_truth_calls(BfclTaskSpec.from_meta(task.meta)), rng, mode)
        result, _ = _replay(env_cls, task, mutated, render)
        rewards.append(result.reward)
        explanations = result.info["explanations"]
        if result.reward == 0.0:
            assert explanations and all(re.match(r"turn \d+: \S", e) for e in explanations), (task.task_id,
                                                                                              explanations)
        else:
            assert result.reward == 1.0 and explanations == []
    score = sum(rewards) / len(rewards)
    print(f"\n{mode} one call: {score:.1%} of {len(rewards)} still pass")
    assert score < 1.0
    # removing a ground-truth call is almost always caught (measured: 1 of 800 passes, a redundant call)
    assert score < (0.02 if mode == "remove" else 0.15)


def test_checker_agrees_with_bfcl_eval(all_tasks):
    """Our checker's verdicts match bfcl_eval's own multi_turn_checker on mutated ground truths (a sample). The
    upstream checker eval()s the call strings: here they are our own renderings of ground-truth literals only."""
    import json

    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    _, tasks = all_tasks
    raw = {}
    for category in CATEGORIES:
        with open(bfcl_dir(None) / f"BFCL_v4_{category}.json") as f:
            raw.update({e["id"]: e for e in map(json.loads, f)})
    rng = random.Random("agree")
    verdicts = {True: 0, False: 0}
    for i in range(0, len(tasks), 4):
        spec = BfclTaskSpec.from_meta(tasks[i].meta)
        mutated = _mutate(ground_truth_calls(spec), rng, rng.choice(["remove", "alter"]))
        ours = check_multi_turn(spec, [[calls] if calls else [] for calls in mutated])
        theirs = multi_turn_checker([[[c.to_python() for c in calls]] if calls else [] for calls in mutated],
                                    spec.ground_truth, dict(raw[spec.bfcl_id]), spec.category, f"lopd_agree_{i}")
        assert ours.valid == theirs["valid"], (spec.bfcl_id, ours.explanations, theirs.get("error_message"))
        verdicts[ours.valid] += 1
    assert verdicts[True] > 0 and verdicts[False] > 0


INJECTIONS = [
    "__import__('os').system('touch {sentinel}')",
    "[mkdir(dir_name='pwned'), __import__('pathlib').Path('{sentinel}').touch()]",
    "().__class__.__bases__[0].__subclasses__()",
    "ls.__globals__['os'].system('touch {sentinel}')",
    "[x for x in ().__class__.__base__.__subclasses__()]",
    "[mkdir(dir_name=x) for x in ['a', 'b']]",
    "mkdir(dir_name=__import__('os').system('touch {sentinel}'))",
    "mkdir(dir_name=open('{sentinel}', 'w').name)",
    "mkdir(**{{'dir_name': 'pwned'}})",
    "mkdir(*['pwned'])",
    "mkdir(dir_name=(lambda: 'pwned')())",
    "mkdir(dir_name='a' + 'b')",
    "mkdir(dir_name=f'{{1}}')",
    "_load_scenario(scenario={{}})",
    "__init__()",
    "getattr(ls, '__globals__')['os']",
    "mkdir(dir_name='pwned').__class__",
]


def _fs_task(tasks):
    return next(tasks[i] for i in range(len(tasks)) if "GorillaFileSystem" in tasks[i].meta["involved_classes"])


@pytest.mark.parametrize("template", INJECTIONS)
def test_ast_parser_rejects_code_injection(all_tasks, template, tmp_path):
    sentinel = tmp_path / "pwned"
    text = template.format(sentinel=sentinel)
    parsed = parse_python_calls(text)
    assert parsed.attempted and parsed.calls == [] and parsed.errors, (text, parsed)
    env_cls, tasks = all_tasks
    env = env_cls()
    env.reset(_fs_task(tasks))
    before = repr(vars(env.runtime.instances["GorillaFileSystem"]))
    result = env.step(text)
    assert not result.done and result.observation[0]["role"] == "tool"
    assert result.observation[0]["content"].startswith("Error")
    assert repr(vars(env.runtime.instances["GorillaFileSystem"])) == before      # nothing ran, not even mkdir
    assert not sentinel.exists()
    assert env.model_turns == [[]]


def test_json_tag_rejects_bad_names_and_unknown_functions_do_not_run(all_tasks, tmp_path):
    for text in ['<tool_call>{"name": "__import__", "arguments": {"name": "os"}}</tool_call>',
                 '<tool_call>{"name": "os.system", "arguments": {"command": "x"}}</tool_call>',
                 '<tool_call>{"name": "_load_scenario", "arguments": {}}</tool_call>',
                 '<tool_call>{"name": "mkdir", "arguments": {"dir name": "x"}}</tool_call>']:
        parsed = parse_json_tag(text)
        assert parsed.errors and not parsed.calls, text
    # syntactically fine calls to names that are not simulator methods are refused at dispatch, not run
    env_cls, tasks = all_tasks
    runtime = ToolRuntime(["GorillaFileSystem"], _fs_task(tasks).meta["initial_config"])
    for name in ("eval", "exec", "open", "print", "system"):
        result = runtime.execute(Call(name, ("1",), {}))
        assert result == f"{ERROR_PREFIX}function '{name}' is not available"
    parsed = parse_python_calls(f"eval(\"__import__('pathlib').Path('{tmp_path / 'x'}').touch()\")")
    assert parsed.calls and runtime.execute_all(parsed.calls)[0].startswith(ERROR_PREFIX)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("text", [
    "[cd(folder='document'", "cd(folder=)", "[cd(folder='a'), ]]", "cd(folder='a') cd(folder='b')",
    "[cd(folder='document'), 1 +]", "```python\n[cd(folder='document')\n```", "[" * 500 + "cd()" + "]" * 500,
    "<tool_call>{\"name\": \"cd\", \"arguments\": {\"folder\": }</tool_call>", "<tool_call>{\"name\": \"cd\"",
    "<tool_call>[1, 2]</tool_call>", "<tool_call>{\"name\": \"cd\", \"arguments\": \"{not json\"}</tool_call>",
])
def test_malformed_call_is_an_error_observation(text):
    parser = "json_tag" if "<tool_call>" in text else "python_calls"
    env_cls, tasks = make_env(_cfg(tool_parser=parser, limit=1))
    task = tasks[0]                                    # multi_turn_base_0: cd, mkdir, mv in turn 0
    env = env_cls()
    env.reset(task)
    result = env.step(text)
    assert not result.done and result.info["bfcl_user_turn"] == 0
    assert len(result.observation) == 1 and result.observation[0]["role"] == "tool"
    assert result.observation[0]["content"].startswith("Error: the function calls could not be parsed")
    # the episode goes on, and a malformed attempt does not count against BFCL's check
    gt = ground_truth_calls(env.spec)
    render = PARSERS[parser].render
    for calls in gt:
        if calls:
            env.step(render(_keyword_form(calls)))
        final = env.step("ok")
    assert final.done and final.reward == 1.0 and final.info["bfcl_call_parse_errors"] == 1


def test_bad_arguments_and_unknown_functions_are_error_results(all_tasks):
    env_cls, tasks = all_tasks
    env = env_cls()
    env.reset(tasks[0])
    result = env.step("[cd(folder='document', bogus=1), nonexistent_fn(a=1), cd(), mkdir(dir_name='temp')]")
    contents = [m["content"] for m in result.observation]
    assert len(contents) == 4 and all(c.startswith(ERROR_PREFIX) for c in contents[:3]), contents
    assert "bogus" in contents[0] and "nonexistent_fn" in contents[1]
    assert not contents[3].startswith("Error")         # the valid call in the batch ran
    # a float precision/exponent that would keep a simulator busy for minutes is refused quickly
    runtime = ToolRuntime(["MathAPI"], {})
    start = time.time()
    assert runtime.execute(Call("power", (), {"base": 10, "exponent": 10 ** 9})).startswith(ERROR_PREFIX)
    assert runtime.execute(Call("logarithm", (), {"value": 5, "base": 2, "precision": 10 ** 9})).startswith(
        ERROR_PREFIX)
    assert runtime.execute(Call("power", (), {"base": 2, "exponent": 10})) == '{"result": 1024}'
    assert time.time() - start < 5


def test_python_calls_parser_accepts_bfcl_formats():
    expected = [Call("cd", (), {"folder": "a"}), Call("tail", (), {"file_name": "x.txt", "lines": -2})]
    for text in ["[cd(folder='a'), tail(file_name='x.txt', lines=-2)]",
                 "```python\n[cd(folder='a'), tail(file_name=\"x.txt\", lines=-2)]\n```",
                 "<think>I should cd first [maybe].</think>\n[cd(folder='a'), tail(file_name='x.txt', lines=-2)]",
                 "Sure, here you go: [cd(folder='a'), tail(file_name='x.txt', lines=-2)]"]:
        assert parse_python_calls(text).calls == expected, text
    assert parse_python_calls("sort('f.txt')").calls == [Call("sort", ("f.txt",), {})]
    for prose in ["The file does not exist, so there is nothing to sort.", "(Nothing left to do.)",
                  "[No function call is needed]", "[]"]:
        no_call = parse_python_calls(prose)
        assert not no_call.calls and not no_call.errors, prose     # ends the user turn, no error observation
    assert parse_json_tag('<tool_call>\n{"name": "cd", "arguments": "{\\"folder\\": \\"a\\"}"}\n</tool_call>'
                          '<tool_call>{"name": "ls", "arguments": {}}</tool_call>').calls == \
        [Call("cd", (), {"folder": "a"}), Call("ls", (), {})]
    assert parse_json_tag("no tags here").attempted is False


def test_miss_func_holdout_turn_adds_the_withheld_function(all_tasks):
    env_cls, tasks = all_tasks
    task = next(tasks[i] for i in range(len(tasks)) if tasks[i].task_id == "bfcl/multi_turn_miss_func_0")
    system = task.messages[0]["content"]
    assert task.messages[0]["role"] == "system" and '"name": "mkdir"' in system
    assert '"name": "sort"' not in system              # withheld until turn 3
    env = env_cls()
    env.reset(task)
    gt = ground_truth_calls(env.spec)
    assert gt[2] == [] and gt[3] == [Call("sort", ("final_report.pdf",), {})]
    render = PARSERS["python_calls"].render
    for turn in range(3):
        if gt[turn]:
            env.step(render(gt[turn]))
        result = env.step("I cannot sort: no function for that." if turn == 2 else "done")
    opening = result.observation[0]["content"]
    assert result.observation[0]["role"] == "user" and '"name": "sort"' in opening
    assert opening.endswith(ADDITIONAL_FUNCTIONS_PROMPT) and result.info["bfcl_user_turn"] == 3


def test_max_turns_bounds_model_steps(all_tasks):
    _, tasks = all_tasks
    env_cls, _ = make_env(_cfg(max_turns=2, limit=1))
    assert env_cls().max_turns == 2
    env = env_cls()
    env.reset(tasks[0])
    assert not env.step("[cd(folder='document')]").done
    result = env.step("[mkdir(dir_name='temp')]")
    assert result.done and result.reward == 0.0
    assert any("max_turns=2" in e for e in result.info["explanations"])
    assert any("force-terminated" in e for e in result.info["explanations"])
    assert env.step("more").done                       # stays finished
    # a budget spent on a plain answer ends the episode before the next question is asked
    env_cls, _ = make_env(_cfg(max_turns=2, limit=1))
    env = env_cls()
    env.reset(tasks[0])
    env.step(PARSERS["python_calls"].render(ground_truth_calls(env.spec)[0]))
    result = env.step("done")
    assert result.done and result.reward == 0.0 and result.info["bfcl_turns_done"] == 1
    assert "before user turn 1 was asked" in result.info["explanations"][0]


def test_single_turn_task_finishes_on_last_step_within_budget(all_tasks):
    _, tasks = all_tasks
    one_turn = next(tasks[i] for i in range(len(tasks)) if len(tasks[i].meta["turns"]) == 1)
    gt = ground_truth_calls(BfclTaskSpec.from_meta(one_turn.meta))[0]
    env_cls, _ = make_env(_cfg(max_turns=1, limit=1))
    env = env_cls()
    env.reset(one_turn)
    result = env.step(PARSERS["python_calls"].render(gt))   # budget spent on the last user turn: it is scored
    assert result.done and result.reward == 1.0, result.info


def test_config_subset_limit_and_errors(tmp_path):
    env_cls, tasks = make_env(_cfg(subset="miss_param,multi_turn_base", limit=5))
    assert [tasks[i].task_id for i in range(len(tasks))] == [
        "bfcl/multi_turn_miss_param_0", "bfcl/multi_turn_base_0", "bfcl/multi_turn_miss_param_1",
        "bfcl/multi_turn_base_1", "bfcl/multi_turn_miss_param_2"]
    _, long_only = make_env(_cfg(subset="long_context"))
    assert len(long_only) == 200 and long_only[0].meta["category"] == "multi_turn_long_context"
    with pytest.raises(ValueError, match="env.bfcl_multiturn.subset: unknown category 'web_search'"):
        make_env(_cfg(subset="base,web_search"))
    with pytest.raises(ValueError, match="tool_parser"):
        make_env(_cfg(tool_parser="xml"))
    with pytest.raises(BfclDataError, match=str(tmp_path)):
        make_env(_cfg(data_dir=str(tmp_path)))


def test_reference_solution_is_the_ground_truth(all_tasks):
    _, tasks = all_tasks
    ref = tasks.reference_solution(0)
    lines = ref.splitlines()
    gt = ground_truth_calls(BfclTaskSpec.from_meta(tasks[0].meta))
    assert len(lines) == len(gt) and lines[0].startswith("turn 1: [cd(folder='document')")
    for line, calls in zip(lines, gt):
        if calls:
            assert parse_python_calls(line.split(": ", 1)[1]).calls == _keyword_form(calls)   # keywords only
        else:
            assert line.endswith("(no call)")
    assert "sort(file_name='final_report.pdf')" in ref


def test_agent_loop_runs_the_env_to_reward_one(all_tasks):
    """The real `run_episodes` loop with a scripted engine and a character-level ChatML tokenizer."""
    from lopd_ray.rollout.agent_loop import Episode, run_episodes
    from lopd_ray.rollout.engines.base import SamplingSpec
    from scripted_agent import CharTokenizer, ScriptedEngine

    _, tasks = all_tasks
    task = tasks[1]
    gt = ground_truth_calls(BfclTaskSpec.from_meta(task.meta))
    script = [t for calls in gt for t in ([PARSERS["python_calls"].render(calls)] if calls else []) + ["done"]]

    env_cls, _ = make_env(_cfg(max_turns=len(script) + 5))
    episode = Episode(task, 0, SamplingSpec(1.0, 1.0, -1, 64, 0), env_cls())
    run_episodes(ScriptedEngine(script), CharTokenizer(), [episode])
    assert episode.done and episode.reward == 1.0 and episode.info["explanations"] == []
    assert len(episode.turn_spans) == len(script)
    env_tokens = [t for t, m in zip(episode.response_ids, episode.loss_mask) if m == 0]
    rendered = CharTokenizer().decode(env_tokens)
    assert "<|im_start|>tool\n" in rendered and "<|im_start|>user\n" in rendered       # tool results, next question
    assert any("current_working_directory" in o for o in episode.observation_texts)
    # every generated token is classed by the env's parser: the call's syntax (1) or its values (0); the eos and
    # the env's tokens are unclassed (-1)
    assert len(episode.token_classes) == len(episode.response_ids)
    assert all(c == -1 for c, m in zip(episode.token_classes, episode.loss_mask) if m == 0)
    start, end = episode.turn_spans[0]
    assert episode.token_classes[start:end] == [int(s) for s in PARSERS["python_calls"].syntax(script[0])] + [-1]
    assert {0, 1} <= set(episode.token_classes[start:end])
