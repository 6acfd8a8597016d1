"""Executing BFCL tool calls on the multi-turn simulators: calls come from `lopd_ray.envs.tool_parsers` and are
dispatched by name to a public method of one of the task's simulator instances (upstream BFCL runs `eval()` on a
rewritten string instead; see shared/design/LESSONS.md item 10).
"""
from __future__ import annotations

import copy
import functools
import importlib
import inspect
import json
from typing import Any

from lopd_ray.envs.tool_parsers import (PARSERS, Call, CallSyntaxError, ParsedCalls, get_parser,  # noqa: F401
                                           parse_call_string, parse_json_tag, parse_python_calls)

# ---- execution on the simulators -------------------------------------------------------------------------------

_BACKEND = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
API_MODULES = {
    "GorillaFileSystem": f"{_BACKEND}.gorilla_file_system",
    "MathAPI": f"{_BACKEND}.math_api",
    "MessageAPI": f"{_BACKEND}.message_api",
    "TwitterAPI": f"{_BACKEND}.posting_api",
    "TicketAPI": f"{_BACKEND}.ticket_api",
    "TradingBot": f"{_BACKEND}.trading_bot",
    "TravelAPI": f"{_BACKEND}.travel_booking",
    "VehicleControlAPI": f"{_BACKEND}.vehicle_control",
}
STATELESS_CLASSES = frozenset({"MathAPI"})
ERROR_PREFIX = "Error during execution: "


@functools.lru_cache(maxsize=None)
def api_class(class_name: str) -> type:
    if class_name not in API_MODULES:
        raise KeyError(f"unknown BFCL API class {class_name!r}")
    try:
        module = importlib.import_module(API_MODULES[class_name])
    except ImportError as e:
        raise ImportError(f"the BFCL simulators are not installed ({e}); run `pip install --no-deps "
                          f"bfcl-eval==2026.3.23 mpmath==1.3.0`") from e
    return getattr(module, class_name)


@functools.lru_cache(maxsize=None)
def public_methods(class_name: str) -> tuple[str, ...]:
    cls = api_class(class_name)
    return tuple(sorted(name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")))


def format_result(result: Any) -> str:
    """A call's return value as BFCL shows it: strings as is, dicts as JSON (str() when not serializable)."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def _resource_guard(class_name: str, call: Call, args: tuple, kwargs: dict) -> str | None:
    """Rejects arguments that would make a simulator compute for minutes (upstream has no such limit)."""
    if class_name != "MathAPI":
        return None
    try:
        bound = inspect.signature(getattr(api_class(class_name), call.name)).bind(None, *args, **kwargs).arguments
    except TypeError:
        return None                                    # the call itself reports the bad arguments
    precision = bound.get("precision")
    if isinstance(precision, int) and not isinstance(precision, bool) and abs(precision) > 10_000:
        return f"{ERROR_PREFIX}precision {precision} is too large (at most 10000)"
    exponent, base = bound.get("exponent"), bound.get("base")
    if call.name == "power" and isinstance(exponent, int) and isinstance(base, int) and abs(exponent) > 10_000:
        return f"{ERROR_PREFIX}exponent {exponent} is too large for an integer power (at most 10000)"
    return None


class ToolRuntime:
    """The simulator instances of one task, loaded with its initial state, and name-based dispatch to them."""

    def __init__(self, involved_classes: list[str], initial_config: dict, long_context: bool = False):
        self.instances: dict[str, Any] = {}
        self.method_owner: dict[str, str] = {}
        for class_name in involved_classes:
            instance = api_class(class_name)()
            if class_name not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(initial_config.get(class_name, {})), long_context=long_context)
            self.instances[class_name] = instance
            for method in public_methods(class_name):
                self.method_owner[method] = class_name     # a later class wins a name clash, as in BFCL

    def execute(self, call: Call) -> str:
        owner = self.method_owner.get(call.name)
        if owner is None:
            return f"{ERROR_PREFIX}function '{call.name}' is not available"
        args, kwargs = copy.deepcopy(call.args), copy.deepcopy(call.kwargs)
        rejected = _resource_guard(owner, call, args, kwargs)
        if rejected:
            return rejected
        try:
            result = getattr(self.instances[owner], call.name)(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any simulator failure becomes the call's result, as in BFCL
            return f"{ERROR_PREFIX}{e}"
        try:
            return format_result(result)
        except Exception as e:  # noqa: BLE001 - e.g. str() of an int over the digit limit
            return f"{ERROR_PREFIX}{e}"

    def execute_all(self, calls: list[Call]) -> list[str]:
        return [self.execute(c) for c in calls]
