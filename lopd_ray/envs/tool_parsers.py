"""Tool-call parsers: model text -> calls, registered by name (`env.<name>.tool_parser`). Nothing here evaluates model
text: Python-style calls are read with `ast.parse` (a call is accepted only when its function is a plain identifier
and every argument is a literal, via `ast.literal_eval` on the argument node); JSON-style calls with `json.loads`.

- `python_calls`: BFCL's prompting format, `[func(a=1, b="x"), g()]` (a single call without brackets also works;
  code fences and `<think>` blocks are ignored).
- `json_tag`: Hermes/Qwen style, `<tool_call>{"name": "func", "arguments": {"a": 1}}</tool_call>`, repeatable.
Each returns `ParsedCalls`: the calls, the syntax errors (then no call of that message is executed), and whether the
message attempted a call at all.
"""
from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

# ---- calls -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def to_python(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({', '.join(parts)})"

    def to_json(self) -> dict:
        if self.args:
            raise ValueError(f"{self.to_python()}: positional arguments have no JSON form")
        return {"name": self.name, "arguments": self.kwargs}


@dataclass
class ParsedCalls:
    calls: list[Call] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    attempted: bool = False       # the message tried to call a function (even if malformed)


class CallSyntaxError(ValueError):
    pass


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise CallSyntaxError(f"invalid function name {name!r}: it must be a plain identifier not starting with '_'")
    return name


def _snippet(node: ast.AST, limit: int = 80) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001 - only for the message
        text = type(node).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def call_from_ast(node: ast.AST) -> Call:
    """A `Call` from one AST node, or CallSyntaxError. Only `name(literal, ..., key=literal, ...)` is accepted."""
    if not isinstance(node, ast.Call):
        raise CallSyntaxError(f"expected a function call, got {type(node).__name__}: {_snippet(node)}")
    if not isinstance(node.func, ast.Name):
        raise CallSyntaxError(f"the function must be called by its plain name (no attributes, subscripts or "
                              f"call chains): {_snippet(node.func)}")
    name = _check_name(node.func.id)
    args = []
    for i, arg in enumerate(node.args):
        if isinstance(arg, ast.Starred):
            raise CallSyntaxError(f"{name}: *args unpacking is not allowed")
        try:
            args.append(ast.literal_eval(arg))
        except Exception:  # noqa: BLE001 - ValueError, TypeError, SyntaxError, RecursionError, MemoryError...
            raise CallSyntaxError(f"{name}: positional argument {i + 1} is not a literal value: {_snippet(arg)}")
    kwargs = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise CallSyntaxError(f"{name}: **kwargs unpacking is not allowed")
        if kw.arg in kwargs:
            raise CallSyntaxError(f"{name}: argument {kw.arg!r} given twice")
        try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
        except Exception:  # noqa: BLE001
            raise CallSyntaxError(f"{name}: argument {kw.arg!r} is not a literal value: {_snippet(kw.value)}")
    return Call(name, tuple(args), kwargs)


def _parse_python_expr(source: str) -> list[Call]:
    """`f(...)` or a list/tuple of such calls -> calls; CallSyntaxError otherwise."""
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as e:
        raise CallSyntaxError(f"invalid call syntax: {e.msg} (line {e.lineno}, column {e.offset})")
    except Exception as e:  # noqa: BLE001 - RecursionError / MemoryError on pathological nesting
        raise CallSyntaxError(f"invalid call syntax: {type(e).__name__}")
    body = tree.body
    if isinstance(body, ast.Call):
        return [call_from_ast(body)]
    if isinstance(body, (ast.List, ast.Tuple)):
        return [call_from_ast(elt) for elt in body.elts]
    raise CallSyntaxError(f"expected a function call or a list of function calls, got {type(body).__name__}: "
                          f"{_snippet(body)}")


@functools.lru_cache(maxsize=65536)
def _parse_ground_truth(source: str) -> tuple[Call, ...]:
    return tuple(_parse_python_expr(source))


def parse_call_string(source: str) -> Call:
    """One ground-truth call string (`"cd(folder='x')"`) -> Call (cached; raises CallSyntaxError)."""
    calls = _parse_ground_truth(source)
    if len(calls) != 1:
        raise CallSyntaxError(f"expected exactly one call in {source!r}")
    return calls[0]


# ---- parsers ---------------------------------------------------------------------------------------------------

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```$", re.DOTALL)
_TOOLCALL_TAG = re.compile(r"<TOOLCALL>(.*?)(?:</TOOLCALL>|$)", re.DOTALL)
_STARTS_LIKE_CALL = re.compile(r"^\[?\s*[A-Za-z_][\w.]*\s*\(")
_EMBEDDED_LIST = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")


def strip_reasoning(text: str) -> str:
    return _THINK.sub("", text).strip()


def _is_code_with_call(body: str) -> bool:
    """Whether the text is a Python expression that calls something (e.g. `a.b['c'].d()`): a call attempt."""
    try:
        tree = ast.parse(body, mode="eval")
    except Exception:  # noqa: BLE001 - prose, or pathological input
        return False
    return any(isinstance(node, ast.Call) for node in ast.walk(tree))


def parse_python_calls(text: str) -> ParsedCalls:
    body = strip_reasoning(text)
    tag = _TOOLCALL_TAG.search(body)
    if tag:
        body = tag.group(1).strip()
    fence = _FENCE.match(body)
    if fence:
        body = fence.group(1).strip()
    if not _STARTS_LIKE_CALL.match(body) and not _is_code_with_call(body):
        embedded = _EMBEDDED_LIST.search(body)
        if not embedded or "]" not in body[embedded.start():]:
            return ParsedCalls()                       # plain text: no call attempted
        body = body[embedded.start():body.rindex("]") + 1]
    try:
        return ParsedCalls(calls=_parse_python_expr(body), attempted=True)
    except CallSyntaxError as e:
        return ParsedCalls(errors=[f"Error: the function calls could not be parsed, nothing was executed: {e}"],
                           attempted=True)


_JSON_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def _json_call(payload: str) -> Call:
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError) as e:
        raise CallSyntaxError(f"invalid JSON in <tool_call>: {e}")
    if not isinstance(obj, dict) or "name" not in obj:
        raise CallSyntaxError('a <tool_call> must hold a JSON object {"name": ..., "arguments": {...}}')
    name = _check_name(obj["name"])
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):                 # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as e:
            raise CallSyntaxError(f"{name}: the arguments string is not valid JSON: {e}")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise CallSyntaxError(f"{name}: \"arguments\" must be a JSON object")
    for key in arguments:
        if not key.isidentifier():
            raise CallSyntaxError(f"{name}: invalid argument name {key!r}")
    return Call(name, (), dict(arguments))


def parse_json_tag(text: str) -> ParsedCalls:
    body = strip_reasoning(text)
    payloads = _JSON_TAG.findall(body)
    if not payloads:
        return ParsedCalls()
    try:
        return ParsedCalls(calls=[_json_call(p.strip()) for p in payloads], attempted=True)
    except CallSyntaxError as e:
        return ParsedCalls(errors=[f"Error: the function calls could not be parsed, nothing was executed: {e}"],
                           attempted=True)


# ---- which characters of a message are tool-call syntax (diagnostics: a divergence split by token class) ---------

_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|-?\d[\d.eE+-]*|\b(?:true|false|null|True|False|None)\b')
_CALL_START = re.compile(r"[A-Za-z_][\w.]*\s*\(")


def _mark_region(mask: list[bool], start: int, end: int, region: str, is_key: Callable[[str, int], bool]) -> None:
    """The region is syntax except its literal values (the inside of a string, a number, a constant), unless
    `is_key(region, literal_end)` says the literal is a key or a function name."""
    mask[start:end] = [True] * (end - start)
    for m in _LITERAL.finditer(region):
        if is_key(region, m.end()):
            continue
        quoted = m.group()[:1] in "\"'"
        lo, hi = start + m.start() + quoted, start + m.end() - quoted
        mask[lo:hi] = [False] * (hi - lo)


def _json_key(region: str, end: int) -> bool:
    """A JSON key (a string followed by ':') or the value of "name" (the function's name)."""
    return bool(re.match(r"\s*:", region[end:])) or bool(re.search(r'"name"\s*:\s*"[^"]*"$', region[:end]))


def json_tag_syntax(text: str) -> list[bool]:
    mask = [False] * len(text)
    for m in _JSON_TAG.finditer(text):
        _mark_region(mask, m.start(), m.end(), m.group(), _json_key)
    return mask


def _closing_paren(text: str, open_at: int) -> int:
    """The index after the parenthesis that closes the one at `open_at` (strings skipped), or len(text)."""
    depth, i = 0, open_at
    while i < len(text):
        literal = _LITERAL.match(text, i) if text[i] in "\"'" else None
        if literal:
            i = literal.end()
            continue
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return i
    return len(text)


def python_calls_syntax(text: str) -> list[bool]:
    mask, i = [False] * len(text), 0
    while (m := _CALL_START.search(text, i)) is not None:
        end = _closing_paren(text, m.end() - 1)
        _mark_region(mask, m.start(), end, text[m.start():end], lambda region, at: False)
        i = end
    return mask


def render_python_calls(calls: list[Call]) -> str:
    return "[" + ", ".join(c.to_python() for c in calls) + "]"


def render_json_tag(calls: list[Call]) -> str:
    return "\n".join(f"<tool_call>\n{json.dumps(c.to_json())}\n</tool_call>" for c in calls)


@dataclass(frozen=True)
class ToolParser:
    parse: Callable[[str], ParsedCalls]
    render: Callable[[list[Call]], str]
    # Per character of a message: True on tool-call syntax (markup, names, keys, punctuation), False on content.
    syntax: Callable[[str], list[bool]]


PARSERS: dict[str, ToolParser] = {
    "python_calls": ToolParser(parse_python_calls, render_python_calls, python_calls_syntax),
    "json_tag": ToolParser(parse_json_tag, render_json_tag, json_tag_syntax),
}


def get_parser(name: str) -> ToolParser:
    if name not in PARSERS:
        raise ValueError(f"env.bfcl_multiturn.tool_parser: unknown parser {name!r}; choose from "
                         f"{', '.join(PARSERS)}")
    return PARSERS[name]


