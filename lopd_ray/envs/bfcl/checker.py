"""BFCL's multi-turn accuracy check, reimplemented (same rules as bfcl_eval's `multi_turn_checker`, own code).

Input: the task and the model's calls, per user turn and per model step (`model_turns[turn][step] = [Call, ...]`;
steps without calls are left out, as BFCL drops empty decodes). Both the model's calls and the ground truth are
executed on fresh simulator instances, turn by turn, the two sides each keeping their state across turns. Then:

- The model must have reached the end of every user turn (else BFCL's "force-terminated").
- Turns whose ground truth is empty (a miss_func / miss_param turn, a few base turns) are not checked; their calls
  still run so the next turns' states are right. (BFCL's separate irrelevance checker is not applied to
  multi-turn entries by its eval runner, so neither here.)
- Otherwise, in order, for each turn, stopping at the first failing turn:
  * the model made at least one call in the turn;
  * state: every public attribute (name not starting with "_") of every ground-truth instance equals the model
    instance's attribute;
  * response: the ground truth's execution results of this turn are all contained, as a multiset, in the model's
    execution results of this turn and all earlier turns (a result already obtained earlier counts).
Failing turns get human-readable explanations (turn, check, what differed); `valid` is True iff there are none.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lopd_ray.envs.bfcl.calls import Call, ToolRuntime, parse_call_string
from lopd_ray.envs.bfcl.data import BfclTaskSpec

MAX_REPR = 160
MAX_DIFFS_PER_CLASS = 8


@dataclass
class CheckResult:
    valid: bool
    explanations: list[str] = field(default_factory=list)
    turns_checked: int = 0            # user turns that passed (or were skipped as empty-ground-truth turns)


def ground_truth_calls(spec: BfclTaskSpec) -> list[list[Call]]:
    return [[parse_call_string(s) for s in turn] for turn in spec.ground_truth]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_REPR else text[:MAX_REPR] + f"... ({len(text)} chars)"


def _public_vars(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")}


def describe_difference(model: Any, truth: Any, path: str, out: list[str], seen: set | None = None) -> None:
    """Appends one line per leaf difference between two unequal values (dicts, sequences, simulator objects)."""
    if len(out) >= MAX_DIFFS_PER_CLASS:
        return
    seen = set() if seen is None else seen
    if isinstance(model, dict) and isinstance(truth, dict):
        for key in truth.keys() - model.keys():
            out.append(f"{path}[{key!r}] missing in the model state (ground truth: {_short(truth[key])})")
        for key in model.keys() - truth.keys():
            out.append(f"{path}[{key!r}] only in the model state: {_short(model[key])}")
        for key in truth.keys() & model.keys():
            if model[key] != truth[key]:
                describe_difference(model[key], truth[key], f"{path}[{key!r}]", out, seen)
        return
    if isinstance(model, (list, tuple)) and isinstance(truth, (list, tuple)) and len(model) == len(truth):
        for i, (m, t) in enumerate(zip(model, truth)):
            if m != t:
                describe_difference(m, t, f"{path}[{i}]", out, seen)
        return
    if (type(model) is type(truth) and hasattr(truth, "__dict__") and not isinstance(truth, type)
            and id(truth) not in seen):
        seen.add(id(truth))
        mv, tv = _public_vars(model), _public_vars(truth)
        for key in tv:
            if key == "parent":                      # back-reference of the file-system tree
                continue
            if key not in mv:
                out.append(f"{path}.{key} missing in the model state")
            elif mv[key] != tv[key]:
                describe_difference(mv[key], tv[key], f"{path}.{key}", out, seen)
        if out:
            return
    out.append(f"{path}: model {_short(model)} != ground truth {_short(truth)}")


def state_differences(model_rt: ToolRuntime, truth_rt: ToolRuntime) -> list[str]:
    lines = []
    for class_name, truth in truth_rt.instances.items():
        model = model_rt.instances[class_name]
        for attr, truth_value in _public_vars(truth).items():
            model_value = getattr(model, attr, None)
            if model_value != truth_value:
                diffs: list[str] = []
                describe_difference(model_value, truth_value, f"{class_name}.{attr}", diffs)
                lines.extend(diffs or [f"{class_name}.{attr} differs"])
    return lines


def missing_results(model_results: list[str], truth_results: list[str]) -> list[int]:
    """Indices of the ground-truth results not found in the model's results (multiset containment, any order)."""
    available = Counter(model_results)
    missing = []
    for i, item in enumerate(truth_results):
        if available[item] > 0:
            available[item] -= 1
        else:
            missing.append(i)
    return missing


def check_multi_turn(spec: BfclTaskSpec, model_turns: list[list[list[Call]]]) -> CheckResult:
    truth_turns = ground_truth_calls(spec)
    n = len(truth_turns)
    if len(model_turns) != n:
        return CheckResult(False, [f"force-terminated: the episode ended after {len(model_turns)} of {n} user "
                                   f"turns, so the remaining turns were never answered"])
    model_rt = ToolRuntime(spec.involved_classes, spec.initial_config, spec.long_context)
    truth_rt = ToolRuntime(spec.involved_classes, spec.initial_config, spec.long_context)
    model_results_so_far: list[str] = []
    for turn, truth_calls in enumerate(truth_turns):
        model_calls = [c for step in model_turns[turn] for c in step]
        model_results_so_far += model_rt.execute_all(model_calls)
        truth_results = truth_rt.execute_all(truth_calls)
        if not truth_calls:
            continue
        if not model_calls:
            return CheckResult(False, [f"turn {turn}: the model made no function call; the ground truth makes "
                                       f"{len(truth_calls)}: {[c.to_python() for c in truth_calls]}"], turn)
        explanations = [f"turn {turn}: state check failed: {line}" for line in state_differences(model_rt, truth_rt)]
        missing = missing_results(model_results_so_far, truth_results)
        if missing:
            pairs = [f"{truth_calls[i].to_python()} -> {_short(truth_results[i])}" for i in missing]
            explanations.append(f"turn {turn}: response check failed: {len(missing)} of {len(truth_results)} "
                                f"ground-truth execution results are not among the model's results so far: "
                                f"{'; '.join(pairs)}")
        if explanations:
            return CheckResult(False, explanations, turn)
    return CheckResult(True, [], n)
