"""Bank entries: a successful rollout as (task text, observation-lite trace), and the texts built from it."""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Callable

from lopd_ray.config import BankConfig
from lopd_ray.data.trajectory import Trajectory

DOCUMENT_MODES = ("task", "task_trace")


@dataclass
class BankEntry:
    entry_id: str
    task_id: str
    task_text: str
    trace_text: str
    reward: float
    policy_version: int


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + "..."


def observation_lite_trace(turns: list[tuple[str, str]], max_observation_chars: int, max_trace_chars: int) -> str:
    """One "Action:" line per turn, then an "Observation:" line cut to `max_observation_chars` characters; an empty
    observation (the last turn, a single-turn task) writes no line. The whole trace is then cut to `max_trace_chars`
    characters. A cut text ends with "..." after its kept characters."""
    lines = []
    for action, observation in turns:
        lines.append(f"Action: {action}")
        if observation:
            lines.append(f"Observation: {_cut(observation, max_observation_chars)}")
    return _cut("\n".join(lines), max_trace_chars)


def entry_from_trajectory(traj: Trajectory, bank_cfg: BankConfig) -> BankEntry:
    """`traj.observation_texts[i]` follows `traj.action_texts[i]`; it may be one shorter (the episode ended on an
    action)."""
    task_text, action_texts, observation_texts = traj.task_text, traj.action_texts, traj.observation_texts
    if len(observation_texts) not in (len(action_texts), len(action_texts) - 1):
        raise ValueError(f"{len(action_texts)} actions but {len(observation_texts)} observations: give one "
                         f"observation per action (the last may be missing)")
    observations = observation_texts + [""] * (len(action_texts) - len(observation_texts))
    trace = observation_lite_trace(list(zip(action_texts, observations)), bank_cfg.max_observation_chars,
                                   bank_cfg.max_trace_chars)
    digest = hashlib.sha1(f"{task_text}\0{trace}".encode()).hexdigest()[:12]
    return BankEntry(entry_id=f"{traj.task_id}@v{traj.policy_version}#{digest}", task_id=traj.task_id,
                     task_text=task_text, trace_text=trace, reward=float(traj.reward),
                     policy_version=traj.policy_version)


def check_document_mode(mode: str) -> None:
    if mode not in DOCUMENT_MODES:
        raise ValueError(f"bank.documents='{mode}' is not supported: choose one of {list(DOCUMENT_MODES)}")


def document_text(entry: BankEntry, mode: str) -> str:
    """What the bank embeds for an entry (`bank.documents`)."""
    check_document_mode(mode)
    return entry.task_text if mode == "task" else entry.task_text + "\n" + entry.trace_text


def composer_input_text_of(task_text: str, trace_text: str) -> str:
    """The composer encoder's input for one retrieved entry (METHOD 2.2)."""
    return f"Task to solve:\n{task_text}\n\nReference past trajectory:\n{trace_text}"


def composer_input_text(entry: BankEntry) -> str:
    """composer.input=entry_task: the entry's own task and its trace."""
    return composer_input_text_of(entry.task_text, entry.trace_text)


def entry_messages(entry: BankEntry) -> list[dict]:
    """The entry as the conversation it came from: its task, then its trace as the answer."""
    return [{"role": "user", "content": entry.task_text}, {"role": "assistant", "content": entry.trace_text}]


Render = Callable[[list[dict]], str]


def _current_task_input(current_task: str, entry: BankEntry, render: Render) -> str:
    return composer_input_text_of(current_task, render(entry_messages(entry)))


def _entry_task_input(current_task: str, entry: BankEntry, render: Render) -> str:
    return composer_input_text(entry)


COMPOSER_INPUTS: dict[str, Callable[[str, BankEntry, Render], str]] = {
    "current_task": _current_task_input,
    "entry_task": _entry_task_input,
}


@functools.lru_cache(maxsize=4)
def chat_tokenizer(model_path: str):
    """The tokenizer of `model_path`, loaded once per process (the run's and the held-out contexts and the cold
    start share it)."""
    from transformers import AutoTokenizer

    from lopd_ray.models import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(model_path))


class ComposerInputs:
    """The composer encoder's input text per retrieved entry, as `composer.input` says: "current_task" (the
    official code's task-conditional form) is "Task to solve:\n" + the task being solved + "\n\nReference past
    trajectory:\n" + the entry rendered with the student's chat template; "entry_task" the entry's own task and
    trace. The tokenizer of `model_path` (a directory or a builtin model's name) renders, loaded on first use."""

    def __init__(self, composer_cfg, model_path: str):
        self.build, self.model_path = COMPOSER_INPUTS[composer_cfg.input], model_path

    def render(self, messages: list[dict]) -> str:
        return chat_tokenizer(self.model_path).apply_chat_template(messages, tokenize=False)

    def texts(self, current_task: str, entries: list[BankEntry]) -> list[str]:
        return [self.build(current_task, entry, self.render) for entry in entries]


def entries_from_successes(trajs: list[Trajectory], bank_cfg) -> list[BankEntry]:
    """Bank entries of the successful trajectories, from the texts the rollout worker recorded."""
    return [entry_from_trajectory(t, bank_cfg) for t in trajs if t.reward >= bank_cfg.success_threshold]
