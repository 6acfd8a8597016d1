"""BFCL v4 multi-turn tasks: loading the question / possible-answer / function-doc files and building the prompts.

Files (JSON Lines) under `<data root>/bfcl/`: `BFCL_v4_multi_turn_<category>.json` (questions, initial state of the
API simulators, involved classes, and for miss_func the withheld functions per turn), `possible_answer/` (per-turn
ground-truth call lists, Python-call strings) and `multi_turn_func_doc/<class file>.json` (function docs).

The prompt follows BFCL's default prompting setup (a system prompt listing every function of the involved classes;
miss_func tasks withhold some functions until the turn that adds them back with BFCL's "I have updated some more
functions..." message). Only the call format differs with the configured tool parser.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")

# Class name -> function-doc file (as in BFCL's executable backend config).
FUNC_DOC_FILES = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}

ADDITIONAL_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"


class BfclDataError(FileNotFoundError):
    """The BFCL data is missing or inconsistent; the message names the file and the fix."""


def bfcl_dir(env_cfg=None) -> Path:
    from lopd_ray.config import EnvConfig
    from lopd_ray.envs.data import data_root

    return data_root(env_cfg or EnvConfig()) / "bfcl"


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise BfclDataError(f"missing BFCL file {path}; set env.data_dir or $LOPD_RAY_DATA to the folder holding "
                            f"bfcl/ (see data/bfcl/SOURCE.md)")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def parse_categories(subset: str) -> list[str]:
    """`env.bfcl_multiturn.subset`: a comma list of base, miss_func, miss_param, long_context (the `multi_turn_`
    prefix is optional); empty: all four."""
    names = [s.strip() for s in (subset or "").split(",") if s.strip()]
    if not names:
        return list(CATEGORIES)
    out = []
    for name in names:
        short = name[len("multi_turn_"):] if name.startswith("multi_turn_") else name
        if short not in CATEGORIES:
            raise ValueError(f"env.bfcl_multiturn.subset: unknown category {name!r}; choose from "
                             f"{', '.join(CATEGORIES)} (comma separated)")
        if short not in out:
            out.append(short)
    return out


@dataclass
class BfclTaskSpec:
    """One BFCL multi-turn entry, JSON-serializable (it travels in `Task.meta`)."""
    bfcl_id: str
    category: str                               # e.g. "multi_turn_miss_func"
    involved_classes: list[str]
    initial_config: dict[str, Any]
    turns: list[list[dict[str, str]]]           # per user turn, its messages ([] for a miss_func holdout turn)
    ground_truth: list[list[str]]               # per user turn, the ground-truth calls as Python-call strings
    functions: list[dict] = field(default_factory=list)               # docs visible from the start
    holdout_functions: dict[str, list[dict]] = field(default_factory=dict)   # turn index (str) -> docs added then

    @property
    def long_context(self) -> bool:
        return "long_context" in self.category

    def to_meta(self) -> dict:
        return {"bfcl_id": self.bfcl_id, "category": self.category, "involved_classes": self.involved_classes,
                "initial_config": self.initial_config, "turns": self.turns, "ground_truth": self.ground_truth,
                "functions": self.functions, "holdout_functions": self.holdout_functions}

    @classmethod
    def from_meta(cls, meta: dict) -> "BfclTaskSpec":
        return cls(**{k: meta[k] for k in ("bfcl_id", "category", "involved_classes", "initial_config", "turns",
                                            "ground_truth", "functions", "holdout_functions")})


def load_func_docs(root: Path) -> dict[str, list[dict]]:
    return {cls: _read_jsonl(root / "multi_turn_func_doc" / fname) for cls, fname in FUNC_DOC_FILES.items()}


def load_specs(root: Path, category: str, func_docs: Optional[dict[str, list[dict]]] = None) -> list[BfclTaskSpec]:
    """The entries of one category, joined with their ground truth and function docs."""
    func_docs = func_docs if func_docs is not None else load_func_docs(root)
    questions = _read_jsonl(root / f"BFCL_v4_multi_turn_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(root / "possible_answer" /
                                                               f"BFCL_v4_multi_turn_{category}.json")}
    specs = []
    for q in questions:
        if q["id"] not in answers:
            raise BfclDataError(f"{q['id']}: no ground truth in possible_answer/BFCL_v4_multi_turn_{category}.json")
        gt = answers[q["id"]]
        if len(gt) != len(q["question"]):
            raise BfclDataError(f"{q['id']}: {len(q['question'])} user turns but {len(gt)} ground-truth turns")
        functions = []
        for cls in q["involved_classes"]:
            if cls not in func_docs:
                raise BfclDataError(f"{q['id']}: no function docs for class {cls}")
            functions.extend(func_docs[cls])
        holdout: dict[str, list[dict]] = {}
        for turn, names in q.get("missed_function", {}).items():
            if q["question"][int(turn)]:
                raise BfclDataError(f"{q['id']}: holdout turn {turn} should have no user message")
            holdout[str(turn)] = [doc for doc in functions if doc["name"] in names]
            missing = set(names) - {doc["name"] for doc in holdout[str(turn)]}
            if missing:
                raise BfclDataError(f"{q['id']}: withheld functions {sorted(missing)} have no docs")
        withheld = {doc["name"] for docs in holdout.values() for doc in docs}
        specs.append(BfclTaskSpec(
            bfcl_id=q["id"], category=q["id"].rsplit("_", 1)[0], involved_classes=list(q["involved_classes"]),
            initial_config=q.get("initial_config", {}), turns=q["question"], ground_truth=gt,
            functions=[doc for doc in functions if doc["name"] not in withheld], holdout_functions=holdout))
    return specs


# ---- prompts ---------------------------------------------------------------------------------------------------

_PERSONA = ("You are an expert in composing functions. You are given a question and a set of possible functions. "
            "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. "
            "If none of the functions can be used, point it out. If the given question lacks the parameters "
            "required by the function, also point it out.")
_MULTITURN = ("At each turn, you should try your best to complete the tasks requested by the user within the "
              "current turn. Continue to output functions to call until you have fulfilled the user's request to "
              "the best of your ability. Once you have no more functions to call, the system will consider the "
              "current turn complete and proceed to the next turn or task.")
_FORMATS = {
    "python_calls": ("You should only return the function calls in your response.\n\nIf you decide to invoke any of "
                     "the function(s), you MUST put it in the format of [func_name1(params_name1=params_value1, "
                     "params_name2=params_value2...), func_name2(params)]\nYou SHOULD NOT include any other text in "
                     "the response."),
    "json_tag": ("For each function call, return a JSON object with the function name and its arguments inside "
                 "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                 "<args-json-object>}\n</tool_call>\nYou may return several <tool_call> blocks in one message. When "
                 "you have no function to call, answer in plain text without any <tool_call> block."),
}


def format_functions(functions: list[dict], tool_parser: str) -> str:
    if tool_parser == "json_tag":
        return "<tools>\n" + "\n".join(json.dumps(doc) for doc in functions) + "\n</tools>"
    return json.dumps(functions, indent=4)


def system_prompt(functions: list[dict], tool_parser: str) -> str:
    if tool_parser not in _FORMATS:
        raise ValueError(f"env.bfcl_multiturn.tool_parser: unknown parser {tool_parser!r}; choose from "
                         f"{', '.join(_FORMATS)}")
    return (f"{_PERSONA}\n\n{_FORMATS[tool_parser]}\n\n{_MULTITURN}\n\n"
            f"Here is a list of functions in JSON format that you can invoke.\n"
            f"{format_functions(functions, tool_parser)}\n")


def turn_messages(spec: BfclTaskSpec, turn: int, tool_parser: str) -> list[dict[str, str]]:
    """The messages that open user turn `turn` (for a holdout turn: the added functions and BFCL's prompt)."""
    key = str(turn)
    if key in spec.holdout_functions:
        text = f"{format_functions(spec.holdout_functions[key], tool_parser)}\n{ADDITIONAL_FUNCTIONS_PROMPT}"
        return [{"role": "user", "content": text}]
    return [{"role": m["role"], "content": m["content"]} for m in spec.turns[turn]]


def opening_messages(spec: BfclTaskSpec, tool_parser: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system_prompt(spec.functions, tool_parser)}] + \
        turn_messages(spec, 0, tool_parser)
