"""HumanEval+ and MBPP+ (EvalPlus) as `CodeProblem`s, and the differential checker that scores a program.

Expected outputs are the canonical solution's outputs on the same inputs, computed once per task in the same
sandbox with the same codec and cached in memory. A candidate passes when every output matches: Python equality of
the decoded builtin values, else EvalPlus's float tolerance (the task's `atol`, or 1e-6 when the expected value is
a float or a list/tuple of floats; rtol 1e-7), plus EvalPlus's special oracles (HumanEval/32 `find_zero`: any root
within atol; MBPP+ regex tasks: "returned something" vs None). Data files: see data/*/SOURCE.md.
"""
from __future__ import annotations

import ast
import gzip
import json
import math
import threading
import zlib
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Optional

from lopd_ray.envs.code.sandbox import Output, RunResult, SandboxLimits, run_program

HUMANEVAL_FILE = "humanevalplus/HumanEvalPlus.jsonl.gz"
MBPP_FILE = "mbppplus/MbppPlus.jsonl.gz"
BENCHMARK_FILES = {"humaneval": HUMANEVAL_FILE, "mbpp": MBPP_FILE}

# Canonical solutions that contradict their task's own MBPP tests (`assertion`); EvalPlus itself special-cases both
# in its evaluator ("are_equivalent": anything passes; "sum_div": also 0 passes). Left out of the task source.
MBPP_KNOWN_BROKEN = {
    "Mbpp/164": "are_equivalent: the canonical div_sum starts at 1 and adds both divisors of every pair, 1 and n "
                "included (23 -> 25.0, 47 -> 49.0), so are_equivalent(23, 47) is False; the task's test asserts True "
                "(both primes have proper-divisor sum 1)",
    "Mbpp/295": "sum_div: the canonical solution sums all divisors including the number (as floats), while the task's "
                "tests expect proper divisors (sum_div(8) == 7, canonical gives 15.0)",
}
# EvalPlus compares these by "returned something other than None" (the canonical solutions return re.Match).
MBPP_OUTPUT_NOT_NONE = frozenset({"check_str", "text_match_three", "text_starta_endb"})


@dataclass(frozen=True)
class CodeProblem:
    task_id: str
    benchmark: str                 # "humaneval" | "mbpp"
    prompt: str                    # HumanEval: signature + docstring; MBPP: the task description
    entry_point: str
    canonical_solution: str        # HumanEval: the body after `prompt`; MBPP: the whole program
    base_inputs: tuple             # argument lists, Python values (MBPP+ types restored)
    plus_inputs: tuple
    atol: float
    tests: str                     # the original tests: HumanEval `test` (a `check` function), MBPP `assertion`

    @property
    def reference_program(self) -> str:
        return self.prompt + self.canonical_solution if self.benchmark == "humaneval" else self.canonical_solution

    @property
    def output_not_none(self) -> bool:
        return self.benchmark == "mbpp" and self.entry_point in MBPP_OUTPUT_NOT_NONE

    @property
    def shown_test(self) -> str:
        """The first of the original MBPP asserts (what the MBPP prompt shows); empty for HumanEval."""
        if self.benchmark != "mbpp":
            return ""
        return next((line.strip() for line in self.tests.splitlines() if line.strip().startswith("assert")), "")

    def inputs(self, base_only: bool) -> list:
        return list(self.base_inputs) if base_only else list(self.base_inputs) + list(self.plus_inputs)


# --------------------------------------------------------------------------------------------------------------
# Loading.

def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _literal(text):
    """A string input that stands for a literal (MBPP+ writes complex numbers as strings): `ast.literal_eval`."""
    return ast.literal_eval(text) if isinstance(text, str) else text


def _each_arg(convert):
    return lambda args: [convert(a) for a in args]


def _first_arg(convert):
    return lambda args: [convert(args[0])] + list(args[1:])


def _list_of_tuples(value):
    return [tuple(v) for v in value]


# JSON has no tuples, sets or complex numbers: per task, how EvalPlus turns an MBPP+ argument list back into the
# types the canonical solution was written for (its `mbpp_deserialize_inputs`; ids absent here are skipped).
_MBPP_INPUT_TYPES = {}
for _ids, _convert in [
    ((2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726, 740, 744, 809),
     _each_arg(tuple)),
    ((63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780), _each_arg(_list_of_tuples)),
    ((75, 413, 444, 753), _first_arg(_list_of_tuples)),
    ((106, 750), lambda args: [args[0], tuple(args[1])] + list(args[2:])),
    ((115,), _first_arg(lambda items: [set(i) if isinstance(i, list) and i else {} for i in items])),
    ((124,), lambda args: [float(_literal(args[0])), complex(_literal(args[1]))]),
    ((250, 405, 446, 617, 720, 763, 808, 307), _first_arg(tuple)),
    ((259, 401, 445), _each_arg(lambda a: tuple(tuple(v) for v in a))),
    ((278,), _first_arg(lambda items: tuple(tuple(i) if isinstance(i, list) else i for i in items))),
    ((722,), _first_arg(lambda d: {k: tuple(v) for k, v in d.items()})),
    ((252,), _first_arg(lambda a: complex(_literal(a)))),
    ((580, 615, 791), _tuples),
]:
    for _id in _ids:
        _MBPP_INPUT_TYPES[f"Mbpp/{_id}"] = _convert


def restore_mbpp_inputs(task_id: str, inputs: list) -> list:
    convert = _MBPP_INPUT_TYPES.get(task_id)
    return list(inputs) if convert is None else [convert(args) for args in inputs]


@lru_cache(maxsize=None)
def load_problems(path: str, benchmark: str) -> tuple[CodeProblem, ...]:
    """All problems of a HumanEval+ or MBPP+ jsonl.gz file, in file order (known-broken ones included)."""
    if benchmark not in BENCHMARK_FILES:
        raise ValueError(f"unknown code benchmark {benchmark!r}: use one of {sorted(BENCHMARK_FILES)}")
    problems = []
    with gzip.open(Path(path), "rt", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            base, plus = rec["base_input"], rec["plus_input"]
            if benchmark == "mbpp":
                base, plus = restore_mbpp_inputs(rec["task_id"], base), restore_mbpp_inputs(rec["task_id"], plus)
            problems.append(CodeProblem(
                task_id=rec["task_id"], benchmark=benchmark, prompt=rec["prompt"], entry_point=rec["entry_point"],
                canonical_solution=rec["canonical_solution"], base_inputs=tuple(base), plus_inputs=tuple(plus),
                atol=float(rec["atol"] or 0.0), tests=rec["test"] if benchmark == "humaneval" else rec["assertion"]))
    return tuple(problems)


# MBPP's own task-id ranges (Austin et al. 2021): 1-10 few-shot prompts, 11-510 test, 511-600 validation,
# 601-974 train. MBPP+ keeps the ids, so its tasks split the same way.
MBPP_TEST_IDS = range(11, 511)


def _mbpp_id(task_id: str) -> int:
    return int(task_id.split("/")[1])


# split name -> which problems of a benchmark belong to it
SPLITS = {
    "test": lambda p: True,
    "train": lambda p: p.benchmark == "mbpp" and _mbpp_id(p.task_id) not in MBPP_TEST_IDS,
    "heldout": lambda p: p.benchmark == "humaneval" or _mbpp_id(p.task_id) in MBPP_TEST_IDS,
}


def split_problems(problems, split: str, exclude: frozenset | set = frozenset()) -> list[CodeProblem]:
    """Deterministic splits, in file order, minus `exclude`. "test": the whole benchmark (what EvalPlus reports).
    "train": MBPP+ tasks from MBPP's prompt, validation and train id ranges (HumanEval+ has none). "heldout": the
    rest, MBPP+ tasks from MBPP's test id range (all of HumanEval+): the evaluation set of a model trained on
    "train"."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for a code benchmark: use one of {sorted(SPLITS)}")
    return [p for p in problems if SPLITS[split](p) and p.task_id not in exclude]


# --------------------------------------------------------------------------------------------------------------
# Output comparison (parent side, on decoded builtin values only).

def _is_floats(x) -> bool:
    if type(x) is float:
        return True
    return type(x) in (list, tuple) and all(type(v) is float for v in x)


def _is_number(x) -> bool:
    return type(x) in (int, float)


def _close(actual, expected, atol: float, rtol: float = 1e-7) -> bool:
    """np.testing.assert_allclose semantics (equal_nan) for numbers and (nested) lists/tuples of numbers."""
    if _is_number(expected):
        if not _is_number(actual):
            return False
        if math.isnan(expected) or math.isnan(actual):
            return math.isnan(expected) and math.isnan(actual)
        if math.isinf(expected) or math.isinf(actual):
            return actual == expected
        return abs(actual - expected) <= atol + rtol * abs(expected)
    if type(expected) in (list, tuple):
        return (type(actual) is type(expected) and len(actual) == len(expected)
                and all(_close(a, e, atol, rtol) for a, e in zip(actual, expected)))
    return False


def _poly(xs, x) -> float:
    return sum(c * math.pow(x, i) for i, c in enumerate(xs))


def outputs_match(problem: CodeProblem, args, expected: Output, actual: Output) -> bool:
    """Whether one candidate result counts as the canonical one (EvalPlus's rules, on decoded builtin values)."""
    try:
        if problem.benchmark == "humaneval" and problem.entry_point == "find_zero":
            root = actual.value() if actual.kind == "value" else None
            return _is_number(root) and abs(_poly(args[0], root)) <= problem.atol
        if expected.kind != actual.kind:
            return False
        if expected.raw == actual.raw:
            return True
        if expected.kind != "value":
            return False
        exp, act = expected.value(), actual.value()
        if act == exp:
            return True
        atol = problem.atol or (1e-6 if _is_floats(exp) else 0.0)
        return atol > 0 and _close(act, exp, atol)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError, MemoryError):
        return False  # a malformed or pathological result never matches


# --------------------------------------------------------------------------------------------------------------
# Checking a program.

@dataclass
class Verdict:
    """`status`: passed | wrong_output | raised | unsupported_output | load_error | timeout | no_nonce |
    output_limit | protocol_error."""

    passed: bool
    status: str
    num_tests: int
    num_passed: int
    wall_s: float
    failure: Optional[dict] = None   # input_index, args, expected, actual (Output or None), message
    run: Optional[RunResult] = None  # the sandbox run (status, stderr tail, pgid, uid) for diagnostics


@dataclass(frozen=True)
class Expected:
    """A task's canonical outputs on the checked inputs. `indices`: which of `problem.inputs(base_only)` are
    checked: those whose canonical result is a value within the sandbox's limits (an output too large to encode,
    or a MemoryError, drops the input; see docs/code_benchmarks.md)."""

    indices: tuple[int, ...]
    raws: tuple[bytes, ...]        # zlib-compressed encoded values (HumanEval+'s are ~300 MB uncompressed)
    wall_s: float
    dropped: tuple[tuple[int, str], ...]   # (input index, why): "too_large", "MemoryError", ...
    largest_bytes: int             # the longest encoded value

    def output(self, position: int) -> Output:
        return Output("value", zlib.decompress(self.raws[position]).decode("utf-8"))


_STATUS_OF_KIND = {"value": "wrong_output", "error": "raised", "unsupported": "unsupported_output"}
# A candidate's result is held and may be decoded by this process, at up to ~25 times its encoded size (a list of
# empty tuples), so it may be at most CANDIDATE_RESULT_FACTOR times the task's longest canonical result (an equal
# value can be written longer: 0.1 as 0.09999999999999999, 0 as false), and CANDIDATE_RESULT_FLOOR_BYTES whatever
# the task; a longer one is "too_large" in the sandbox, never read whole. The canonical runs keep the sandbox's own
# limit (SandboxLimits.max_result_bytes).
CANDIDATE_RESULT_FLOOR_BYTES = 1 << 20
CANDIDATE_RESULT_FACTOR = 4
_expected_cache: dict[tuple[str, str, bool], Expected] = {}
_expected_lock = threading.Lock()


class CodeChecker:
    """Scores programs on base (+ plus) inputs against cached canonical outputs.

    The candidate's wall-clock limit is max(limits.timeout_s, time_factor x the canonical run's wall time)."""

    def __init__(self, limits: SandboxLimits, base_only: bool = False, time_factor: float = 4.0,
                 canonical_timeout_s: float = 300.0):
        self.limits, self.base_only, self.time_factor = limits, base_only, time_factor
        self.canonical_timeout_s = canonical_timeout_s

    def expected(self, problem: CodeProblem) -> Expected:
        """The canonical outputs on this checker's inputs (computed in the sandbox once per process, cached)."""
        key = (problem.benchmark, problem.task_id, self.base_only)
        with _expected_lock:
            if key in _expected_cache:
                return _expected_cache[key]
        limits = replace(self.limits, timeout_s=self.canonical_timeout_s)
        run = run_program(problem.reference_program, problem.entry_point, problem.inputs(self.base_only), limits,
                          output_not_none=problem.output_not_none)
        if not run.ok:
            raise RuntimeError(f"{problem.task_id}: the canonical solution did not run cleanly ({run.status}: "
                               f"{run.message or run.stderr_tail[-500:]})")
        kept = [(i, out) for i, out in enumerate(run.outputs) if out.kind == "value"]
        expected = Expected(indices=tuple(i for i, _ in kept),
                            raws=tuple(zlib.compress(out.raw.encode("utf-8"), 1) for _, out in kept),
                            wall_s=run.wall_s,
                            dropped=tuple((i, out.raw) for i, out in enumerate(run.outputs) if out.kind != "value"),
                            largest_bytes=max((len(out.raw) for _, out in kept), default=0))
        with _expected_lock:
            return _expected_cache.setdefault(key, expected)

    def check(self, problem: CodeProblem, program: str) -> Verdict:
        expected = self.expected(problem)
        all_inputs = problem.inputs(self.base_only)
        inputs = [all_inputs[i] for i in expected.indices]
        result_bytes = max(CANDIDATE_RESULT_FLOOR_BYTES, CANDIDATE_RESULT_FACTOR * expected.largest_bytes)
        limits = replace(self.limits, timeout_s=max(self.limits.timeout_s, self.time_factor * expected.wall_s),
                         max_result_bytes=min(self.limits.max_result_bytes, result_bytes))
        failure: dict = {}

        def on_result(position: int, output: Output) -> bool:
            if outputs_match(problem, inputs[position], expected.output(position), output):
                return True
            failure.update(position=position, actual=output)
            return False

        run = run_program(program, problem.entry_point, inputs, limits, output_not_none=problem.output_not_none,
                          on_result=on_result)
        n = len(inputs)
        if run.ok:
            return Verdict(True, "passed", n, n, run.wall_s, run=run)
        position = failure["position"] if run.status == "stopped" else run.num_outputs
        status = _STATUS_OF_KIND[failure["actual"].kind] if run.status == "stopped" else run.status
        detail = {"input_index": expected.indices[position] if position < n else None,
                  "args": inputs[position] if position < n else None,
                  "expected": expected.output(position) if position < n else None,
                  "actual": failure.get("actual"),
                  "message": "" if run.status == "stopped" else run.message or run.stderr_tail[-1000:]}
        return Verdict(False, status, n, position, run.wall_s, detail, run)
