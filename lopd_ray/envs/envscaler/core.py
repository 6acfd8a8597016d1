"""The EnvScaler format, in memory.

An environment is a Python class whose instance attributes are its state and whose tool methods change or read
that state (`EnvSpec`: the class factory plus JSON-schema tool specs). A scenario is an initial state
(`init_config`), a task text, a checklist of boolean checks over the final state (reward = the fraction that pass)
and, where known, an oracle call sequence whose arguments may reference values returned by earlier calls.

The generated suite and EnvScaler's released JSON (see loader.py) both end up as these types.
"""
from __future__ import annotations

import builtins
import copy
import functools
import inspect
import json
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Literal, Optional, Protocol, Union

JSONDict = dict[str, Any]
MISSING = object()


# ---------------------------------------------------------------------------------------------------------------
# Environments and tools

class ToolError(Exception):
    """A domain failure reported to the agent (unknown id, insufficient funds, ...), never a crash."""


def tool(fn: Callable) -> Callable:
    """Marks a method as a tool. The result follows EnvScaler's convention: {"success": true, "data": ...}, or
    {"success": false, "error": ...} when the method raises ToolError."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs) -> JSONDict:
        try:
            return {"success": True, "data": fn(self, *args, **kwargs)}
        except ToolError as exc:
            return {"success": False, "error": str(exc)}

    wrapper.is_tool = True
    return wrapper


class ToolEnvironment:
    """Base of the generated environments: state = the attributes set from `init_config` (as EnvScaler's
    `init_env_instance` does); tools = the methods marked with @tool."""

    def __init__(self, init_config: JSONDict):
        for key, value in copy.deepcopy(init_config).items():
            setattr(self, key, value)

    def _get(self, collection: str, key: str, what: str) -> JSONDict:
        records = getattr(self, collection)
        if not isinstance(key, str) or key not in records:
            raise ToolError(f"unknown {what} '{key}'")
        return records[key]

    def _new_id(self, prefix: str) -> str:
        self.next_id += 1
        return f"{prefix}{self.next_id}"


JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
                               dict: "object"}


def type_schema(annotation: Any) -> JSONDict:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return {"type": JSON_TYPES[type(args[0])], "enum": list(args)}
    if origin is Union:
        return type_schema(next(a for a in args if a is not type(None)))
    if origin is list:
        return {"type": "array", "items": type_schema(args[0])} if args else {"type": "array"}
    if origin is dict:
        return {"type": "object"}
    return {"type": JSON_TYPES[annotation]}


def tool_spec(fn: Callable) -> JSONDict:
    """The OpenAI/EnvScaler function spec of a tool method: the description is its docstring, and each parameter
    is declared `name: Annotated[type, "what it is"]`."""
    hints = typing.get_type_hints(fn, include_extras=True)
    properties, required = {}, []
    for name, param in inspect.signature(fn).parameters.items():
        if name == "self":
            continue
        hint = hints.get(name)
        if typing.get_origin(hint) is not Annotated or not isinstance(hint.__metadata__[0], str):
            raise ValueError(f"tool {fn.__qualname__}: parameter '{name}' has no description; declare it as "
                             f"{name}: Annotated[type, \"what it is\"]")
        properties[name] = {**type_schema(hint.__origin__), "description": hint.__metadata__[0]}
        if param.default is inspect.Parameter.empty:
            required.append(name)
    if not fn.__doc__:
        raise ValueError(f"tool {fn.__qualname__} has no docstring")
    return {"type": "function", "function": {"name": fn.__name__, "description": " ".join(fn.__doc__.split()),
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": required}}}


def tool_names(cls: type) -> list[str]:
    """Tool methods in definition order (base classes first)."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        names += [n for n, attr in vars(klass).items() if getattr(attr, "is_tool", False) and n not in names]
    return names


def tool_specs(cls: type) -> list[JSONDict]:
    return [tool_spec(getattr(cls, name)) for name in tool_names(cls)]


@dataclass
class EnvSpec:
    """One environment: how to build an instance from an init_config, and the tools the agent sees."""
    name: str
    introduction: str
    rules: list[str]
    tools: list[JSONDict]
    factory: Callable[[JSONDict], Any]
    class_name: str = ""
    class_path: Optional[str] = None      # "module:Class" of an importable class (the generated suite)
    class_code: Optional[str] = None      # EnvScaler's env_class_code (released data)

    def tool(self, name: str) -> Optional[JSONDict]:
        return next((t["function"] for t in self.tools if t["function"]["name"] == name), None)


# ---------------------------------------------------------------------------------------------------------------
# Argument validation against the tool specs (JSON types; EnvScaler's Python type names are aliases)

TYPE_ALIASES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "list": "array",
                "dict": "object", "List": "array", "Dict": "object", "none": "null", "None": "null"}
TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def type_error(value: Any, schema: JSONDict) -> Optional[str]:
    declared = schema.get("type")
    types = [TYPE_ALIASES.get(t, t) for t in (declared if isinstance(declared, list) else [declared])]
    known = [t for t in types if t in TYPE_CHECKS]
    if known and not any(TYPE_CHECKS[t](value) for t in known):
        return f"expected {'/'.join(known)}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {schema['enum']}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        errors = [type_error(v, schema["items"]) for v in value]
        return next((f"item: {e}" for e in errors if e), None)
    return None


def argument_error(spec: JSONDict, arguments: JSONDict) -> Optional[str]:
    params = spec.get("parameters") or {}
    properties = params.get("properties") or {}
    unknown = [k for k in arguments if k not in properties]
    if unknown:
        return f"unexpected argument(s) {unknown}; parameters are {list(properties)}"
    missing = [k for k in params.get("required", []) if k not in arguments]
    if missing:
        return f"missing required argument(s) {missing}"
    for name, value in arguments.items():
        optional_null = value is None and name not in params.get("required", [])
        problem = None if optional_null else type_error(value, properties[name])
        if problem:
            return f"argument '{name}': {problem}"
    return None


class ToolRuntime:
    """One live environment instance: validated calls by name, state snapshots. Every failure is a result."""

    def __init__(self, spec: EnvSpec, init_config: JSONDict):
        self.spec = spec
        self.instance = spec.factory(copy.deepcopy(init_config))

    def execute(self, name: str, arguments: JSONDict) -> JSONDict:
        schema = self.spec.tool(name)
        if schema is None:
            names = [t["function"]["name"] for t in self.spec.tools]
            return {"success": False, "error": f"unknown tool '{name}'; available tools: {names}"}
        problem = argument_error(schema, arguments)
        if problem:
            return {"success": False, "error": f"bad arguments for '{name}': {problem}"}
        kwargs = {k: v for k, v in arguments.items() if v is not None}
        try:
            result = json.loads(json.dumps(getattr(self.instance, name)(**copy.deepcopy(kwargs)), default=str))
            return result if isinstance(result, dict) else {"success": True, "data": result}
        except Exception as exc:  # a tool bug or an argument the schema let through: the agent sees it
            return {"success": False, "error": f"tool '{name}' failed: {type(exc).__name__}: {exc}"}

    def state(self) -> JSONDict:
        """EnvScaler's `get_state_info`: every non-dunder attribute, deep-copied."""
        return copy.deepcopy({k: v for k, v in vars(self.instance).items()
                              if not (k.startswith("__") and k.endswith("__"))})


# ---------------------------------------------------------------------------------------------------------------
# Checks over the final state

def lookup(state: Any, path: typing.Sequence) -> Any:
    """Walks dict keys / list indices; MISSING where the path does not resolve."""
    for key in path:
        if isinstance(state, dict) and key in state:
            state = state[key]
        elif isinstance(state, list) and isinstance(key, int) and -len(state) <= key < len(state):
            state = state[key]
        else:
            return MISSING
    return state


def matches(record: Any, where: JSONDict) -> bool:
    """Field equality; {"$contains": x} asks that the field (a list, dict or string) contains x."""
    if not isinstance(record, dict):
        return False
    for key, wanted in where.items():
        value = record.get(key, MISSING)
        if isinstance(wanted, dict) and set(wanted) == {"$contains"}:
            if not isinstance(value, (list, dict, str)) or wanted["$contains"] not in value:
                return False
        elif value is MISSING or value != wanted:
            return False
    return True


def records(value: Any) -> list:
    return list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []


CHECK_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda v, x: v is not MISSING and v == x,
    "contains": lambda v, x: isinstance(v, (list, dict, str)) and x in v,
    "not_contains": lambda v, x: isinstance(v, (list, dict, str)) and x not in v,
    "absent": lambda v, x: v is MISSING,
    "match": lambda v, x: any(matches(r, x) for r in records(v)),
    "no_match": lambda v, x: v is not MISSING and not any(matches(r, x) for r in records(v)),
}


class Check(Protocol):
    description: str

    def passes(self, initial: JSONDict, final: JSONDict) -> bool: ...


@dataclass(frozen=True)
class StateCheck:
    """A declarative check: CHECK_OPS[op](value at `path` in the final state, `value`)."""
    op: str
    path: tuple
    value: Any = None
    description: str = ""

    def passes(self, initial: JSONDict, final: JSONDict) -> bool:
        return bool(CHECK_OPS[self.op](lookup(final, self.path), self.value))

    def to_json(self) -> JSONDict:
        return {"op": self.op, "path": list(self.path), "value": self.value}

    @staticmethod
    def from_json(data: JSONDict, description: str = "") -> "StateCheck":
        if data["op"] not in CHECK_OPS:
            raise ValueError(f"unknown check op '{data['op']}'; known: {sorted(CHECK_OPS)}")
        return StateCheck(data["op"], tuple(data["path"]), data.get("value"), description)


@dataclass
class CodeCheck:
    """EnvScaler's check: `def check_func(final_state)` source, run with `initial_state` as a global. The code
    comes from the dataset file (trusted like any code you install), never from the agent."""
    description: str
    code: str
    _compiled: Any = field(default=None, repr=False, compare=False)

    def passes(self, initial: JSONDict, final: JSONDict) -> bool:
        if self._compiled is None:
            self._compiled = compile(self.code, f"<check {self.description[:40]}>", "exec")
        namespace = {"__builtins__": builtins, "initial_state": copy.deepcopy(initial)}
        try:
            exec(self._compiled, namespace)
            return namespace["check_func"](copy.deepcopy(final)) is True
        except Exception:
            return False


def state_check_code(check: StateCheck) -> str:
    """EnvScaler-style `check_func` source equivalent to a declarative check (needs lopd_ray importable)."""
    payload = json.dumps(check.to_json(), sort_keys=True)
    return ("def check_func(final_state):\n"
            "    import json\n"
            "    from lopd_ray.envs.envscaler.core import StateCheck\n"
            f"    return StateCheck.from_json(json.loads({payload!r})).passes(initial_state, final_state)\n")


# ---------------------------------------------------------------------------------------------------------------
# Scenarios and oracle calls

@dataclass
class OracleCall:
    """A tool call; argument values may be {"$ref": i, "path": [...]}: a value of call i's result."""
    name: str
    arguments: JSONDict


def ref(call: int, *path: Any) -> JSONDict:
    """A value inside the `data` of an earlier call's result."""
    return {"$ref": call, "path": ["data", *path]}


def is_ref(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"$ref", "path"}


def resolve(value: Any, results: list[JSONDict]) -> Any:
    """Replaces references by the values they point at; KeyError where one does not resolve."""
    if is_ref(value):
        found = lookup(results[value["$ref"]], value["path"]) if value["$ref"] < len(results) else MISSING
        if found is MISSING:
            raise KeyError(f"reference {value} does not resolve")
        return found
    if isinstance(value, dict):
        return {k: resolve(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, results) for v in value]
    return value


def referenced_calls(value: Any) -> set[int]:
    if is_ref(value):
        return {value["$ref"]}
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return set().union(*(referenced_calls(v) for v in items))


def dependent_calls(oracle: list[OracleCall]) -> int:
    """Size of the largest group of calls linked by references (0 without any reference): 3 means a later call
    needs values returned by earlier ones across at least three calls."""
    parent = list(range(len(oracle)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    linked: set[int] = set()
    for i, call in enumerate(oracle):
        for j in referenced_calls(call.arguments):
            parent[root(i)] = root(j)
            linked |= {i, j}
    sizes: dict[int, int] = {}
    for i in linked:
        sizes[root(i)] = sizes.get(root(i), 0) + 1
    return max(sizes.values(), default=0)


@dataclass
class Scenario:
    scenario_id: str
    env_name: str
    task: str
    init_config: JSONDict
    checks: list[Check]
    oracle: list[OracleCall] = field(default_factory=list)


def score(checks: list[Check], initial: JSONDict, final: JSONDict) -> int:
    """How many checks pass (a check that raises counts as failed)."""
    passed = 0
    for check in checks:
        try:
            passed += bool(check.passes(initial, final))
        except Exception:
            pass
    return passed


def run_oracle(spec: EnvSpec, scenario: Scenario) -> tuple[list[JSONDict], list[JSONDict], ToolRuntime]:
    """Plays the oracle on a fresh instance: (resolved calls, results, runtime)."""
    runtime = ToolRuntime(spec, scenario.init_config)
    calls, results = [], []
    for call in scenario.oracle:
        arguments = resolve(call.arguments, results)
        calls.append({"name": call.name, "arguments": arguments})
        results.append(runtime.execute(call.name, arguments))
    return calls, results, runtime


@dataclass
class Catalog:
    """Environments by name and their scenarios, in a fixed order; `origin` says where they came from."""
    envs: dict[str, EnvSpec]
    scenarios: list[Scenario]
    origin: str

    def restrict(self, names: list[str]) -> "Catalog":
        unknown = [n for n in names if n not in self.envs]
        if unknown:
            raise ValueError(f"unknown envscaler environment(s) {unknown}; known: {sorted(self.envs)}")
        return Catalog({n: s for n, s in self.envs.items() if n in names},
                       [s for s in self.scenarios if s.env_name in names], self.origin)
