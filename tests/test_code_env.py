"""The `code` env: data loading, the sandbox's containment, the codec, answer extraction, and the canonical
solutions of HumanEval+ / MBPP+ on their base and plus inputs (sandbox runs on a thread pool of 2): every 8th task
by default, all tasks with LOPD_RAY_ALL_CANONICAL=1 (`make test-canonical`, about 4 minutes more)."""
from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import env_config
from lopd_ray.config import ConfigError, EnvConfig
from lopd_ray.envs import data as data_module
from lopd_ray.envs import make_env
from lopd_ray.envs.code import (MBPP_KNOWN_BROKEN, CodeChecker, SandboxLimits, build_program, extract_code,
                                load_problems, run_program)
from lopd_ray.envs.code import jail
from lopd_ray.envs.code.benchmarks import BENCHMARK_FILES, outputs_match
from lopd_ray.envs.code.sandbox import Output, Unsupported, decode_value, encode_value, isolation, live_processes

try:
    DATA = data_module.data_root(EnvConfig())
except ConfigError as exc:
    pytest.skip(f"benchmark data not available: {exc}", allow_module_level=True)

POOL = 2
# The slowest canonical solutions (a few seconds to ~25 s per run), scheduled first so that the pool has no long tail.
SLOW_FIRST = ["Mbpp/599", "Mbpp/255", "Mbpp/392", "Mbpp/271", "Mbpp/603", "Mbpp/123", "Mbpp/592", "Mbpp/630",
              "HumanEval/130", "HumanEval/15", "HumanEval/139", "HumanEval/59", "HumanEval/36", "HumanEval/94",
              "HumanEval/83"]


ALL_CANONICAL = os.environ.get("LOPD_RAY_ALL_CANONICAL") == "1"


def _slow_first(problems):
    rank = {tid: i for i, tid in enumerate(SLOW_FIRST)}
    return sorted(problems, key=lambda p: rank.get(p.task_id, len(rank)))


def _canonical_set(problems: dict) -> list:
    """All tasks, or every 8th task outside the slowest ones."""
    if ALL_CANONICAL:
        return _slow_first(problems.values())
    return [p for i, p in enumerate(problems.values()) if i % 8 == 0 and p.task_id not in SLOW_FIRST]


def _pmap(fn, items):
    with ThreadPoolExecutor(POOL) as ex:
        return list(ex.map(fn, items))


def _problems(benchmark):
    return load_problems(str(DATA / BENCHMARK_FILES[benchmark]), benchmark)


@pytest.fixture(scope="module")
def humaneval():
    return {p.task_id: p for p in _problems("humaneval")}


@pytest.fixture(scope="module")
def mbpp():
    return {p.task_id: p for p in _problems("mbpp")}


@pytest.fixture(scope="module")
def checker():
    return CodeChecker(SandboxLimits(timeout_s=10.0))


# ---------------------------------------------------------------------------------------------------------------
# Data root and loading.

def test_data_root_resolution(tmp_path, monkeypatch):
    explicit, from_env = tmp_path / "explicit", tmp_path / "from_env"
    explicit.mkdir()
    from_env.mkdir()
    monkeypatch.setenv("LOPD_RAY_DATA", str(from_env))
    assert data_module.data_root(EnvConfig(data_dir=str(explicit))) == explicit
    assert data_module.data_root(EnvConfig()) == from_env
    monkeypatch.delenv("LOPD_RAY_DATA")
    in_repo = tmp_path / "repo" / "data"  # a checkout at tmp_path/repo, whatever machine runs the test
    in_repo.mkdir(parents=True)
    (tmp_path / "shared" / "data").mkdir(parents=True)  # never read: nothing beside the checkout is a data source
    monkeypatch.setattr(data_module, "_REPO_ROOT", tmp_path / "repo")
    assert data_module.data_root(EnvConfig()) == in_repo
    with pytest.raises(ConfigError) as err:
        data_module.data_root(EnvConfig(data_dir=str(tmp_path / "missing")))
    assert "env.data_dir" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="mbppplus/MbppPlus.jsonl.gz"):
        data_module.data_file(EnvConfig(data_dir=str(explicit)), BENCHMARK_FILES["mbpp"])


def test_loading_counts_and_restored_types(humaneval, mbpp):
    assert len(humaneval) == 164 and len(mbpp) == 399
    assert sum(len(p.plus_inputs) for p in humaneval.values()) == 122_683
    assert sum(len(p.plus_inputs) for p in mbpp.values()) == 42_082
    assert humaneval["HumanEval/32"].atol == 1e-4 and humaneval["HumanEval/0"].atol == 0.0
    # JSON lost the tuples/complex numbers; the MBPP+ loader restores them the way EvalPlus does.
    assert all(type(a) is tuple for args in mbpp["Mbpp/2"].base_inputs for a in args)
    a, b = mbpp["Mbpp/124"].base_inputs[0]
    assert (type(a), type(b), b) == (float, complex, 1j)
    assert mbpp["Mbpp/252"].plus_inputs[0] == [complex(1, 2)]
    assert mbpp["Mbpp/2"].shown_test.startswith("assert similar_elements(")
    assert humaneval["HumanEval/0"].reference_program.startswith(humaneval["HumanEval/0"].prompt)


def test_make_code_factory_and_splits():
    env_cls, tasks = make_env(env_config("code", subset="mbpp", split="test"))
    assert len(tasks) == 397 and not {t for t in MBPP_KNOWN_BROKEN} & set(tasks.by_id)
    env_cls, tasks = make_env(env_config("code", subset="humaneval", split="test", limit=5, max_turns=3))
    assert len(tasks) == 5 and env_cls().max_turns == 3 and tasks[4].task_id == "HumanEval/4"
    assert "```python" in tasks[0].messages[0]["content"] and tasks.reference_solution(0).startswith("```python\n")
    with pytest.raises(ConfigError, match="no train split"):
        make_env(env_config("code", subset="humaneval", split="train"))
    # MBPP's own id ranges: 11-510 is its test range; train and heldout partition MBPP+ and never overlap.
    _, train = make_env(env_config("code", subset="mbpp", split="train"))
    _, heldout = make_env(env_config("code", subset="mbpp", split="heldout"))
    train_ids = {int(t.split("/")[1]) for t in train.by_id}
    heldout_ids = {int(t.split("/")[1]) for t in heldout.by_id}
    assert len(train_ids) == 160 and len(heldout_ids) == 237 and not train_ids & heldout_ids
    assert all(11 <= i <= 510 for i in heldout_ids) and not any(11 <= i <= 510 for i in train_ids)
    with pytest.raises(ConfigError, match="env.code.subset"):
        make_env(env_config("code", subset="apps"))


# ---------------------------------------------------------------------------------------------------------------
# Codec, comparison, extraction.

def test_codec_round_trip_and_strictness():
    value = [1, -2 ** 100, 2.5, float("nan"), float("-inf"), "s", b"\x00b", None, True, (1, (2,)), {3, 4},
             frozenset({"x"}), {"k": [1.5, {"n": None}], (1, 2): 3}, 1 + 2j, [[], ()]]
    back = decode_value(encode_value(value))
    assert repr(back) == repr(value) and type(back[9]) is tuple and type(back[10]) is set
    assert type(decode_value(encode_value([True, 1]))[0]) is bool

    class AlwaysEqual:
        def __eq__(self, other):
            return True

    class SneakyInt(int):
        def __eq__(self, other):
            return True

    for bad in (AlwaysEqual(), [1, AlwaysEqual()], SneakyInt(3), {"k": SneakyInt(1)}, iter([1])):
        with pytest.raises(Unsupported):
            encode_value(bad)


def test_a_forged_result_of_values_that_hash_alike_is_refused_not_built():
    """20000 distinct multiples of 2**61 - 1 all hash to 0: as a set or as dict keys the parent would build them in
    time quadratic in their number (13 s for 1 MiB). The decoder refuses such a result instead (a line the harness
    never sends: the candidate's own set would have had to be built in the jail's time)."""
    alike = [k * ((1 << 61) - 1) for k in range(1, 20001)]
    as_set = '["set",[%s]]' % ",".join(encode_value(v) for v in alike)
    as_dict = '["dict",[%s]]' % ",".join("[%s,null]" % encode_value(v) for v in alike)
    for text in (as_set, as_dict, as_set.replace('["set"', '["frozenset"', 1)):
        with pytest.raises(ValueError, match="hash_collisions"):
            decode_value(text)
    few = set(alike[:32]) | {-1, -2}  # -1 and -2 share a hash too; a few alike are decoded as they are
    assert decode_value(encode_value(few)) == few


def test_outputs_match_rules(humaneval, mbpp):
    def out(value):
        return Output("value", encode_value(value))

    p0, p2, p32 = humaneval["HumanEval/0"], humaneval["HumanEval/2"], humaneval["HumanEval/32"]
    assert outputs_match(p0, [[1.0], 0.5], out(True), out(True))
    assert not outputs_match(p0, [[1.0], 0.5], out(True), out(False))
    assert outputs_match(p0, [], out(2), out(2.0))                      # Python equality, as EvalPlus
    assert not outputs_match(p0, [], out([1, 2]), out((1, 2)))          # list is not tuple
    assert outputs_match(p0, [], out(0.1 + 0.2), out(0.3))              # floats: 1e-6 when atol is 0
    assert not outputs_match(p0, [], out(0.3), out(0.3 + 1e-5))
    assert outputs_match(p2, [], out([0.5, float("nan")]), out([0.5 + 1e-7, float("nan")]))
    assert not outputs_match(p0, [], out(1), Output("error", "ValueError"))
    assert not outputs_match(p0, [], out(1), Output("value", "[not json"))
    # find_zero: any root within atol counts, not just the canonical one.
    xs = [-6, 11, -6, 1]
    assert outputs_match(p32, [xs], out(1.0), out(3.0)) and not outputs_match(p32, [xs], out(1.0), out(2.5))
    assert not outputs_match(p32, [xs], out(1.0), out("3.0"))
    regex_task = next(p for p in mbpp.values() if p.output_not_none)
    assert regex_task.entry_point in {"check_str", "text_match_three", "text_starta_endb"}


def test_extract_code_and_build_program(humaneval, mbpp):
    assert extract_code("no fences\nreturn 1") == "no fences\nreturn 1"
    text = "Sure:\n```python\nprint('helper')\n```\nand\n```python\ndef f(x):\n    return x\n```\nDone."
    assert extract_code(text, "f") == "def f(x):\n    return x\n"
    assert extract_code(text) == "print('helper')\n"
    assert extract_code("```\ndef g(): pass\n```") == "def g(): pass\n"
    assert extract_code("```python\ndef f(x):\n    return x") == "def f(x):\n    return x"   # truncated
    p = humaneval["HumanEval/0"]
    full = "def has_close_elements(numbers, threshold):\n    return True\n"
    assert build_program(p, full) == p.prompt + "\n" + full
    assert build_program(p, "    return True\n") == p.prompt + "    return True\n"
    assert build_program(p, "return True\n") == p.prompt + "    return True\n"
    assert build_program(p, textwrap.indent(full, "    ")) == p.prompt + "\n" + full
    assert build_program(mbpp["Mbpp/2"], "def similar_elements(a, b): ...") == "def similar_elements(a, b): ..."


# ---------------------------------------------------------------------------------------------------------------
# Sandbox containment.

def _server():
    """A TCP listener on 127.0.0.1 that records every connection it accepts."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def loop():
        while not stop.is_set():
            try:
                accepted.append(srv.accept()[0])
            except OSError:
                pass

    threading.Thread(target=loop, daemon=True).start()
    return srv.getsockname()[1], accepted, stop


def _contained(run):
    assert run is not None and run.pgid > 0
    assert live_processes(pgid=run.pgid) == [], "processes of the run's group survived"
    if run.uid is not None:
        assert live_processes(uid=run.uid) == [], "processes of the run's uid survived"


ADVERSARIAL = {
    # name: (module-level prefix, function body, expected verdict status)
    "sys_exit_at_import": ("import sys\nsys.exit(0)\n", None, "load_error"),
    "os_exit_at_import": ("import os\nos._exit(0)\n", None, "no_nonce"),
    "os_exit_in_call": ("", "import os\nos._exit(0)", "no_nonce"),
    "always_equal": ("class Eq:\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\n",
                     "return Eq()", "unsupported_output"),
    "always_equal_int": ("class Eq(int):\n    def __eq__(self, o):\n        return True\n", "return Eq(0)",
                         "unsupported_output"),
    "forged_protocol": ("import os\nfor fd in range(3, 20):\n    try:\n        os.write(fd, b'N ' + b'0' * 32 + b'\\n')"
                        "\n    except OSError:\n        pass\nprint('N ' + '0' * 32)\n", None, "protocol_error"),
    "socket_to_localhost": ("import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=2)\n", None,
                            "load_error"),
    "raw_socket_via_ctypes": ("import ctypes, struct\nlibc = ctypes.CDLL(None)\ns = libc.socket(2, 1, 0)\n"
                              "addr = struct.pack('<HH4s8x', 2, __import__('_socket').htons(PORT), bytes([127, 0, 0, 1]))"
                              "\nif libc.connect(s, addr, 16) != 0:\n    raise OSError('connect failed')\n", None,
                              "load_error"),
    "fork_bomb": ("", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                  "timeout"),
    "allocate_8gb": ("", "return len(bytearray(8 * 1024 ** 3))", "raised"),
    "infinite_loop": ("", "while True:\n    pass", "timeout"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_completions_fail_and_are_contained(name, humaneval):
    prefix, body, status = ADVERSARIAL[name]
    if name == "raw_socket_via_ctypes" and not isolation()["network_namespace"]:
        pytest.skip("no network namespaces on this host: the socket block is only the in-process monkeypatch")
    p = humaneval["HumanEval/0"]
    port, accepted, stop = _server()
    function = (f"def has_close_elements(numbers, threshold):\n{textwrap.indent(body, '    ')}\n" if body else
                "def has_close_elements(numbers, threshold):\n    return any(abs(a - b) < threshold "
                "for i, a in enumerate(numbers) for b in numbers[i + 1:])\n")
    code = prefix.replace("PORT", str(port)) + function
    env_cls, tasks = make_env(env_config("code", subset="humaneval", split="test", limit=1,
                                         sandbox_timeout_s=2.0))
    env = env_cls()
    env.reset(tasks[0])
    start = time.monotonic()
    result = env.step(f"```python\n{code}```")
    elapsed = time.monotonic() - start
    time.sleep(0.3)
    stop.set()
    assert result.done and result.reward == 0.0
    assert result.info["code/status"] == status, result.info
    assert accepted == [], "the sandbox reached a socket on the host's 127.0.0.1"
    assert elapsed < 10.0
    verdict = env.checker.check(p, build_program(p, code))  # the same run again, to look at its processes
    assert not verdict.passed
    _contained(verdict.run)


def test_sandbox_limits_bound_forks_and_memory():
    limits = SandboxLimits(timeout_s=5.0)
    forks = ("def f():\n    import os, time\n    n = 0\n    for _ in range(50):\n        try:\n"
             "            pid = os.fork()\n        except OSError:\n            break\n        if pid == 0:\n"
             "            time.sleep(30)\n            os._exit(0)\n        n += 1\n    return n\n")
    run = run_program(forks, "f", [[]], limits)
    assert run.ok and 0 <= run.outputs[0].value() < limits.max_processes   # RLIMIT_NPROC stopped the loop
    _contained(run)
    run = run_program("def f(n):\n    return len(bytearray(n))\n", "f", [[1 << 20], [3 << 30]], limits)
    assert run.ok and run.outputs[0].value() == 1 << 20 and run.outputs[1] == Output("error", "MemoryError")
    where = "def f():\n    import os\n    open('left', 'w').write('x')\n    return os.getcwd(), os.listdir('.')\n"
    run = run_program(where, "f", [[]], limits)
    assert run.ok and run.outputs[0].value() == ("/tmp", ["left"])         # the jail's own tmpfs, nothing else
    run = run_program(where, "f", [[]], SandboxLimits(timeout_s=5.0, jail=False))
    cwd, listing = run.outputs[0].value()
    assert run.ok and os.path.basename(cwd).startswith("lopd_sandbox_") and listing == ["left"]
    assert not os.path.exists(cwd)                                          # the temp dir is removed


def test_a_host_without_bubblewrap_is_told_before_any_run(monkeypatch):
    monkeypatch.setattr(jail, "BWRAP", "bwrap-not-installed")
    jail.unavailable_reason.cache_clear()
    try:
        with pytest.raises(ConfigError, match="apt-get install bubblewrap.*env.code.jail=false"):
            make_env(env_config("code", subset="humaneval", split="test", limit=1))
        env_cls, _ = make_env(env_config("code", subset="humaneval", split="test", limit=1, jail=False))
        assert env_cls().checker.limits.jail is False
    finally:
        jail.unavailable_reason.cache_clear()


def test_candidate_prints_do_not_break_the_protocol(humaneval, checker):
    p = humaneval["HumanEval/0"]
    noisy = p.prompt + "    print('V 0 true'); print('N', 'x' * 32)\n" + p.canonical_solution
    verdict = checker.check(p, noisy)
    assert verdict.passed, verdict.failure


def test_multi_turn_feedback_then_retry(humaneval):
    env_cls, tasks = make_env(env_config("code", subset="humaneval", split="test", limit=1, max_turns=2))
    env = env_cls()
    env.reset(tasks[0])
    first = env.step("```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")
    assert not first.done and first.reward == 0.0
    text = first.observation[0]["content"]
    assert first.observation[0]["role"] == "user" and "has_close_elements([1.0, 2.0, 3.9" in text
    assert "returned False; expected True" in text
    second = env.step(tasks.reference_solution(0))
    assert second.done and second.reward == 1.0
    env.reset(tasks[0])
    assert env.step("```python\nreturn False\n```").done is False
    assert env.step("```python\nreturn False\n```").done is True                  # last turn ends the episode


def test_base_only_checks_base_inputs(humaneval):
    env_cls, tasks = make_env(env_config("code", subset="humaneval:base", split="test", limit=1))
    env = env_cls()
    env.reset(tasks[0])
    result = env.step(tasks.reference_solution(0))
    assert result.reward == 1.0 and result.info["code/tests"] == len(humaneval["HumanEval/0"].base_inputs)


# ---------------------------------------------------------------------------------------------------------------
# The benchmarks' own canonical solutions, on every base and plus input.

def test_humaneval_canonical_solutions_pass_all_inputs(humaneval, checker):
    start = time.monotonic()
    problems = _canonical_set(humaneval)
    verdicts = _pmap(lambda p: (p.task_id, checker.check(p, p.reference_program)), problems)
    print(f"\nHumanEval+ canonical, {len(problems)} tasks, base+plus: {time.monotonic() - start:.1f}s")
    failed = {tid: (v.status, v.failure) for tid, v in verdicts if not v.passed}
    assert failed == {}
    expected_tests = sum(len(p.base_inputs) + len(p.plus_inputs) for p in problems)
    assert sum(v.num_tests for _, v in verdicts) == expected_tests                   # no input was dropped
    assert not ALL_CANONICAL or expected_tests == 1570 + 122_683


def test_humaneval_empty_bodies_fail(humaneval, checker):
    verdicts = _pmap(lambda p: checker.check(p, build_program(p, "    pass\n")), _canonical_set(humaneval))
    assert sum(v.passed for v in verdicts) == 0
    assert {v.status for v in verdicts} == {"wrong_output"}


def test_mbpp_canonical_solutions_pass_all_inputs(mbpp, checker):
    start = time.monotonic()
    problems = _canonical_set(mbpp)
    verdicts = _pmap(lambda p: (p.task_id, checker.check(p, p.reference_program)), problems)
    print(f"\nMBPP+ canonical, {len(problems)} tasks, base+plus: {time.monotonic() - start:.1f}s")
    assert {tid: v.status for tid, v in verdicts if not v.passed} == {}
    # Outputs too large for the result channel (16 MiB encoded) are dropped; only Mbpp/255 has any.
    dropped = {p.task_id: [i for i, _ in checker.expected(p).dropped] for p in problems
               if checker.expected(p).dropped}
    assert dropped == ({"Mbpp/255": [88, 89, 93, 99, 103]} if ALL_CANONICAL else {})


def test_mbpp_canonical_solutions_against_original_tests(mbpp):
    """397/399 canonical solutions pass the original MBPP asserts (with `import math`, as EvalPlus's harness adds);
    the two that do not are exactly the documented known-broken tasks (by default the known-broken and every 8th
    task, all 399 with LOPD_RAY_ALL_CANONICAL=1)."""
    limits = SandboxLimits(timeout_s=20.0)
    problems = list(mbpp.values()) if ALL_CANONICAL else [
        p for i, p in enumerate(mbpp.values()) if i % 8 == 0 or p.task_id in MBPP_KNOWN_BROKEN]
    runs = _pmap(lambda p: (p.task_id, run_program("import math\n" + p.canonical_solution + "\n" + p.tests, None,
                                                   [], limits)), problems)
    failing = {tid for tid, run in runs if not run.ok}
    assert not ALL_CANONICAL or len(runs) - len(failing) == 397
    assert failing == set(MBPP_KNOWN_BROKEN)
    assert all(run.status == "load_error" and run.message.startswith("AssertionError")
               for tid, run in runs if tid in failing)


def test_float_outputs_are_compared_with_tolerance(humaneval, checker):
    p = humaneval["HumanEval/4"]                                       # mean_absolute_deviation, atol 1e-6
    reordered = p.prompt + ("    mean = sum(reversed(numbers)) / len(numbers)\n"
                            "    return sum(abs(x - mean) for x in reversed(numbers)) / len(numbers)\n")
    assert checker.check(p, reordered).passed
    off = p.prompt + "    return sum(abs(x - sum(numbers) / len(numbers)) for x in numbers) / len(numbers) + 1e-3\n"
    assert checker.check(p, off).status == "wrong_output"
    assert math.isclose(1e-6, p.atol)


@pytest.mark.skipif(os.geteuid() != 0, reason="private sandbox uids are allocated only when running as root")
def test_identically_seeded_processes_draw_different_sandbox_uids():
    """Rollout workers seed `random` alike; their sandboxes must still get distinct uids (a run's end kills every
    process of its uid)."""
    code = "import random; random.seed(0); from lopd_ray.envs.code.sandbox import _allocate_uid; print(_allocate_uid())"
    uids = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
            for _ in range(3)}
    assert len(uids) == 3, uids


def test_held_out_evaluation_runs_each_task_in_an_env_of_the_held_out_split(tiny_model_dir):
    """A code env is bound to its split's problems: a held-out task stepped in an env of the training split is not
    found there and every held-out episode failed."""
    from lopd_ray.config import load_config
    from lopd_ray.rollout.worker import RolloutRequest, RolloutWorker

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_config(os.path.join(repo, "recipes", "grpo_letters_cpu.yaml"),
                      [f"model.path={tiny_model_dir}", "rollout.engine=hf", "env.name=code", "env.split=train",
                       "env.code.subset=mbpp", "eval.split=heldout", "eval.every_steps=1", "rollout.max_retries=0"])
    worker = RolloutWorker(cfg, tiny_model_dir)
    trajs = worker.evaluate_held_out([RolloutRequest(i, i, 7 + i) for i in range(2)])
    assert [t.error for t in trajs] == [None, None]
    held_out_ids = [worker.held_out[1][i].task_id for i in range(2)]
    assert [t.task_id for t in trajs] == held_out_ids
    assert not set(held_out_ids) & {worker.tasks[i].task_id for i in range(len(worker.tasks))}
    assert all(t.info["code/status"] for t in trajs)  # the candidates ran against the held-out tests
