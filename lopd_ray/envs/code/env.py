"""`code`: write a Python function for a HumanEval+ or MBPP+ task; reward 1.0 iff it matches the canonical solution
on every base and plus input (or base only), checked in the sandbox. Single-turn by default; with
`env.code.max_turns > 1` a failing attempt is answered with its first failing test and the agent may try again."""
from __future__ import annotations

import functools
import re
import textwrap
import threading
from typing import Callable, Optional

from lopd_ray.errors import ConfigError
from lopd_ray.envs.base import Env, StepResult, Task, TaskSource
from lopd_ray.envs.code.benchmarks import (BENCHMARK_FILES, MBPP_KNOWN_BROKEN, CodeChecker, CodeProblem, Verdict,
                                          load_problems, split_problems)
from lopd_ray.envs.code import jail
from lopd_ray.envs.code.sandbox import Output, SandboxLimits
from lopd_ray.envs.data import data_file

HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Reply with the complete function, signature "
                         "included, in one ```python code block.\n\n```python\n{prompt}```")
MBPP_INSTRUCTION = ("{description}\n\nYour code should pass this test:\n\n{test}\n\nReply with the Python function "
                    "in one ```python code block.")

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(text: str, entry_point: str = "") -> str:
    """The code in a model's answer: the first fenced python block that defines `entry_point`, else the first
    python block, else the first fenced block, else the whole text. An unclosed fence (a truncated answer) runs to
    the end of the text."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    pool = python or [body for _, body in blocks]
    if not pool:
        return text
    if entry_point:
        defines = re.compile(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.M)
        for body in pool:
            if defines.search(body):
                return body
    return pool[0]


def _compiles(source: str) -> bool:
    """Whether `source` compiles (not run; unlike `ast.parse` this also rejects e.g. `return` outside a function)."""
    try:
        compile(source, "<candidate>", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError):
        return False


def _defines_at_top_level(source: str, name: str) -> bool:
    return re.search(rf"^(async\s+)?def\s+{re.escape(name)}\s*\(", source, re.M) is not None


def build_program(problem: CodeProblem, code: str) -> str:
    """The program the sandbox runs for an extracted answer.

    HumanEval: a full function (a top-level `def <entry_point>`, after removing indentation common to all lines) is
    appended to the prompt, whose own definition it replaces while the prompt's imports and helpers stay; anything
    else is taken as the body and appended to the prompt as is, or indented by four spaces when only that compiles.
    MBPP: the code itself (dedented when only that compiles)."""
    dedented = textwrap.dedent(code)
    if problem.benchmark != "humaneval":
        return dedented if not _compiles(code) and _compiles(dedented) else code
    if _defines_at_top_level(dedented, problem.entry_point):
        return problem.prompt + "\n" + dedented
    body = problem.prompt + code
    if _compiles(body):
        return body
    indented = problem.prompt + textwrap.indent(code, "    ")
    return indented if _compiles(indented) else body


def _short(value, limit: int = 300) -> str:
    try:
        text = repr(value)
    except ValueError:  # ints beyond the decimal-conversion limit
        text = f"<int with {value.bit_length()} bits>"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def _describe_output(output: Optional[Output]) -> str:
    if output is None:
        return "nothing"
    if output.kind == "error":
        return f"raised {output.raw}"
    if output.kind == "unsupported":
        return ("a result too large to check" if output.raw == "too_large"
                else f"an object of type {output.raw} (only builtin types such as int, str, list, dict count)")
    try:
        return _short(output.value())
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):
        return "a malformed result"


def feedback(problem: CodeProblem, verdict: Verdict) -> str:
    """The observation after a failing attempt: the first failing test."""
    f = verdict.failure or {}
    if verdict.status == "load_error":
        return f"Your code failed before any test ran: {f.get('message', '')[:1500]}\nFix it and reply with the " \
               f"complete corrected code in one ```python code block."
    call = f"{problem.entry_point}({', '.join(_short(a, 200) for a in f['args'])})" if f.get("args") is not None \
        else problem.entry_point
    if verdict.status in ("wrong_output", "raised", "unsupported_output"):
        what = f"returned {_describe_output(f['actual'])}" if verdict.status != "raised" \
            else _describe_output(f["actual"])
        result = f"{call} {what}; expected {_describe_output(f['expected'])}."
    elif verdict.status == "timeout":
        result = f"Your code ran out of time on {call} ({f.get('message', '')})."
    else:
        result = f"Your code did not finish the tests ({verdict.status}) at {call}: {f.get('message', '')[:500]}"
    return f"Test {verdict.num_passed + 1} of {verdict.num_tests} failed: {result}\nFix it and reply with the " \
           f"complete corrected code in one ```python code block."


class CodeTasks(TaskSource):
    def __init__(self, problems: list[CodeProblem]):
        self.problems = problems
        self.by_id = {p.task_id: p for p in problems}

    def __len__(self) -> int:
        return len(self.problems)

    def __getitem__(self, index: int) -> Task:
        p = self.problems[index]
        if p.benchmark == "humaneval":
            text = HUMANEVAL_INSTRUCTION.format(prompt=p.prompt)
        else:
            text = MBPP_INSTRUCTION.format(description=p.prompt.strip().strip("'\"").strip(), test=p.shown_test)
        return Task(task_id=p.task_id, messages=[{"role": "user", "content": text}],
                    meta={"benchmark": p.benchmark, "entry_point": p.entry_point})

    def reference_solution(self, index: int) -> str:
        return f"```python\n{self.problems[index].reference_program.strip()}\n```"


class CodeEnv(Env):
    # One candidate at a time per process, whatever rollout.env_concurrency: a candidate's time limit is a multiple
    # of the canonical run's time, measured with a core to itself.
    checking = threading.Lock()

    def __init__(self, tasks: CodeTasks, checker: CodeChecker, max_turns: int):
        super().__init__(max_turns)
        self.tasks, self.checker = tasks, checker

    def reset(self, task: Task) -> None:
        self.problem = self.tasks.by_id[task.task_id]
        self.turn = 0

    def step(self, action_text: str) -> StepResult:
        self.turn += 1
        program = build_program(self.problem, extract_code(action_text, self.problem.entry_point))
        with self.checking:
            verdict = self.checker.check(self.problem, program)
        info = {"code/status": verdict.status, "code/tests_passed": verdict.num_passed,
                "code/tests": verdict.num_tests, "code/run_s": round(verdict.wall_s, 3)}
        if verdict.passed or self.turn >= self.max_turns:
            return StepResult(done=True, reward=1.0 if verdict.passed else 0.0, info=info)
        return StepResult(done=False, reward=0.0, info=info,
                          observation=[{"role": "user", "content": feedback(self.problem, verdict)}])


def make_code(env_cfg, own) -> tuple[Callable[[], Env], TaskSource]:
    """`env.code.subset`: "humaneval" or "mbpp", with ":base" to check the base inputs only (HumanEval / MBPP rather
    than HumanEval+ / MBPP+). `env.split`: "test" is the whole benchmark (minus MBPP+'s known-broken tasks), MBPP+
    also splits into "train" and "heldout" by MBPP's own id ranges. `env.limit`: the first N tasks."""
    benchmark, _, tests = own.subset.partition(":")
    if benchmark not in BENCHMARK_FILES or tests not in ("", "base"):
        raise ConfigError(f"env.code.subset={own.subset!r} is not a code benchmark: use env.code.subset=humaneval "
                          f"or env.code.subset=mbpp (add ':base' to check base inputs only)")
    problems = load_problems(str(data_file(env_cfg, BENCHMARK_FILES[benchmark])), benchmark)
    try:
        chosen = split_problems(problems, env_cfg.split, exclude=set(MBPP_KNOWN_BROKEN))
    except ValueError as exc:
        raise ConfigError(f"env.split={env_cfg.split!r}: {exc}") from None
    if not chosen:
        raise ConfigError(f"env.split={env_cfg.split!r} of code/{benchmark} is empty: HumanEval+ has no train "
                          f"split; train on env.code.subset=mbpp env.split=train, or use env.split=test")
    if env_cfg.limit:
        chosen = chosen[:env_cfg.limit]
    if own.jail and jail.unavailable_reason():
        raise ConfigError(f"env.code.jail=true but {jail.unavailable_reason()}: install it (apt-get install "
                          f"bubblewrap; `make install` does) or set env.code.jail=false to run candidates under "
                          f"process limits only (they can then read the host's readable files, the benchmark's "
                          f"solutions included)")
    checker = CodeChecker(SandboxLimits(timeout_s=own.sandbox_timeout_s, jail=own.jail), base_only=tests == "base")
    tasks = CodeTasks(chosen)
    return functools.partial(CodeEnv, tasks, checker, max(1, own.max_turns)), tasks
