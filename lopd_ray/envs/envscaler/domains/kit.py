"""What every generated domain uses: the `Domain` record, an environment base with the record operations tools
share, tools declared in one statement (find a record by a field, set fields, delete), a seeded picker, a scenario
draft and check builders."""
from __future__ import annotations

import datetime
import inspect
import random
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Optional

from lopd_ray.envs.envscaler.core import OracleCall, StateCheck, ToolEnvironment, ToolError, tool
from lopd_ray.envs.envscaler.core import ref  # noqa: F401 (re-export)

FIRST_NAMES = ("Ava", "Ben", "Chloe", "Daniel", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kira", "Liam",
               "Maya", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wes", "Xena",
               "Yusuf", "Zoe", "Amir", "Bea", "Cyrus", "Dana")
LAST_NAMES = ("Adler", "Brooks", "Chen", "Diaz", "Evans", "Fischer", "Garcia", "Hart", "Ito", "Jensen", "Khan",
              "Larsen", "Moreau", "Nakamura", "Okafor", "Petrov", "Quinlan", "Rossi", "Silva", "Tanaka", "Ueda",
              "Varga", "Weber", "Xu", "Yilmaz", "Zimmer", "Alvarez", "Bauer", "Costa", "Dubois")
WORDS = ("amber", "birch", "cobalt", "delta", "ember", "fable", "granite", "harbor", "indigo", "juniper", "kestrel",
         "lumen", "maple", "nimbus", "onyx", "prairie", "quartz", "raven", "saffron", "tundra", "umber", "velvet",
         "willow", "zephyr", "summit", "canyon", "meadow", "lagoon", "orchid", "falcon")


class DomainEnv(ToolEnvironment):
    """The environments' base: records live in dicts keyed by id (`collection` names the state attribute), and
    `what` names a record in error messages ("unknown member 'M1234'")."""

    def _find(self, collection: str, error: str, **fields: Any) -> tuple[str, dict]:
        """The first (id, record) whose `fields` have the given values; ToolError(error) where none has."""
        for record_id, record in getattr(self, collection).items():
            if all(record[name] == value for name, value in fields.items()):
                return record_id, record
        raise ToolError(error)

    def _select(self, collection: str, id_key: str, **fields: Any) -> list[dict]:
        """The records whose `fields` have the given values (None matches any value), as {id_key: id, **record}."""
        return [{id_key: record_id, **record} for record_id, record in getattr(self, collection).items()
                if all(value is None or record[name] == value for name, value in fields.items())]

    def _get_in_state(self, collection: str, key: str, what: str, error: str, **expected: Any) -> dict:
        """The record (as `_get`), or ToolError(error) unless its `expected` fields have the given values."""
        record = self._get(collection, key, what)
        if any(record[name] != value for name, value in expected.items()):
            raise ToolError(error)
        return record

    def _insert(self, collection: str, prefix: str, record: dict) -> str:
        """Stores a new record under a fresh id (`prefix` and the next counter value); returns the id."""
        record_id = self._new_id(prefix)
        getattr(self, collection)[record_id] = record
        return record_id

    def _update(self, collection: str, key: str, what: str, **changes: Any) -> dict:
        """Sets fields of a record; returns the changes and the record's id, under "<what>_id"."""
        self._get(collection, key, what).update(changes)
        return {f"{what}_id": key, **changes}

    def _delete(self, collection: str, key: str, what: str) -> None:
        self._get(collection, key, what)
        del getattr(self, collection)[key]


class DeclaredTool:
    """A tool declared in one statement of an environment class, `find_x = find_by_field(...)`. When the class is
    made it becomes an ordinary @tool method named after its attribute, with this signature and docstring (the tool
    spec reads both). `parameters` maps each argument to (annotation, description); `body(self, **arguments)` does
    the work."""

    def __init__(self, description: str, parameters: dict[str, tuple[Any, str]], body: Callable[..., Any]):
        self.description, self.parameters, self.body = description, parameters, body

    def __set_name__(self, owner: type, name: str) -> None:
        signature = inspect.Signature(
            [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
            + [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)
               for p, (annotation, _) in self.parameters.items()])
        body = self.body

        def method(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            return body(**bound.arguments)

        method.__name__, method.__qualname__ = name, f"{owner.__qualname__}.{name}"
        method.__signature__ = signature
        method.__annotations__ = {p: Annotated[annotation, text] for p, (annotation, text) in self.parameters.items()}
        method.__doc__ = self.description
        setattr(owner, name, tool(method))


def find_by_field(collection: str, id_key: Optional[str], description: str, error: str,
                  **field_doc: str) -> DeclaredTool:
    """A tool finding the first record whose one field (the keyword's name, also the argument's) has the given
    value: the record as {id_key: id, **record}, or the record alone where id_key is None. `error` is formatted
    with the argument."""
    (field_name, text), = field_doc.items()

    def find(self: DomainEnv, **given: Any) -> dict:
        record_id, record = self._find(collection, error.format(**given), **given)
        return dict(record) if id_key is None else {id_key: record_id, **record}
    return DeclaredTool(description, {field_name: (str, text)}, find)


def set_fields(collection: str, what: str, description: str, id_doc: str, **changes: Any) -> DeclaredTool:
    """A tool setting fixed field values on the record named by its one argument, `<what>_id`."""
    return DeclaredTool(description, {f"{what}_id": (str, id_doc)},
                    lambda self, **given: self._update(collection, given[f"{what}_id"], what, **changes))


def delete_record(collection: str, what: str, description: str, id_doc: str, done: str) -> DeclaredTool:
    """A tool deleting the record named by its one argument, `<what>_id`; returns {<what>_id: id, done: True}."""
    def delete(self: DomainEnv, **given: Any) -> dict:
        self._delete(collection, given[f"{what}_id"], what)
        return {f"{what}_id": given[f"{what}_id"], done: True}
    return DeclaredTool(description, {f"{what}_id": (str, id_doc)}, delete)


def at_least_one(value: int, name: str) -> None:
    if value < 1:
        raise ToolError(f"{name} must be at least 1")


def increase(record: dict, field_name: str, amount: int, amount_name: str) -> int:
    """Adds `amount` (at least 1, else a ToolError naming `amount_name`) to a record's field; returns the sum."""
    at_least_one(amount, amount_name)
    record[field_name] += amount
    return record[field_name]


def append_once(items: list, item: Any) -> list:
    if item not in items:
        items.append(item)
    return items


def parse_date(text: str) -> datetime.date:
    try:
        return datetime.date.fromisoformat(text)
    except (TypeError, ValueError):
        raise ToolError(f"'{text}' is not a date in YYYY-MM-DD form") from None


class Pick(random.Random):
    """A seeded random source with the helpers generators need; seeded by a string, so stable across runs."""

    def people(self, n: int) -> list[str]:
        names = [f"{f} {l}" for f in FIRST_NAMES for l in LAST_NAMES]
        return self.sample(names, n)

    def ids(self, prefix: str, n: int, digits: int = 4) -> list[str]:
        numbers = self.sample(range(10 ** (digits - 1), 10 ** digits), n)
        return [f"{prefix}{k}" for k in numbers]

    def words(self, n: int) -> list[str]:
        return self.sample(WORDS, n)

    def date(self, month: int = 6, lo: int = 1, hi: int = 28) -> str:
        return f"2025-{month:02d}-{self.randint(lo, hi):02d}"

    def dates(self, n: int, month: int = 6) -> list[str]:
        return [f"2025-{month:02d}-{d:02d}" for d in sorted(self.sample(range(1, 29), n))]

    def counter(self) -> int:
        """A starting value for an environment's `next_id`."""
        return self.randint(100, 900) * 10


@dataclass
class Draft:
    """A scenario under construction: the task, the initial state, the oracle calls and the checks."""
    task: str
    init: dict[str, Any]
    oracle: list[OracleCall] = field(default_factory=list)
    checks: list[StateCheck] = field(default_factory=list)

    def call(self, tool_name: str, /, **arguments: Any) -> int:
        """Appends an oracle call; returns its index for `ref(index, ...)`."""
        self.oracle.append(OracleCall(tool_name, arguments))
        return len(self.oracle) - 1

    def check(self, *checks: StateCheck) -> "Draft":
        self.checks += checks
        return self


@dataclass(frozen=True)
class Domain:
    """A generated environment: its class, its description, and its task kinds (scenario i uses kind i mod n)."""
    name: str
    env_class: type[ToolEnvironment]
    introduction: str
    rules: tuple[str, ...]
    kinds: tuple[Callable[[Pick], Draft], ...]


def _path(path: Any) -> tuple:
    return tuple(path) if isinstance(path, (tuple, list)) else (path,)


def _text(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def eq(path: Any, value: Any, description: str = "") -> StateCheck:
    p = _path(path)
    return StateCheck("eq", p, value, description or f"{_text(p)} == {value!r}")


def contains(path: Any, value: Any, description: str = "") -> StateCheck:
    p = _path(path)
    return StateCheck("contains", p, value, description or f"{_text(p)} contains {value!r}")


def not_contains(path: Any, value: Any, description: str = "") -> StateCheck:
    p = _path(path)
    return StateCheck("not_contains", p, value, description or f"{_text(p)} does not contain {value!r}")


def absent(path: Any, description: str = "") -> StateCheck:
    p = _path(path)
    return StateCheck("absent", p, None, description or f"{_text(p)} no longer exists")


def match(path: Any, where: dict[str, Any], description: str = "") -> StateCheck:
    p = _path(path)
    return StateCheck("match", p, where, description or f"some record of {_text(p)} has {where!r}")


def no_match(path: Any, where: dict[str, Any], description: str = "") -> StateCheck:
    p = _path(path)
    return StateCheck("no_match", p, where, description or f"no record of {_text(p)} has {where!r}")


def has(value: Any) -> dict[str, Any]:
    """A `match` condition: the field contains `value`."""
    return {"$contains": value}
