"""Skill-SD's skill library: natural-language skills {success_analysis, mistake_analysis, golden_workflow} written
from the agent's own groups of rollouts, chosen per task by UCB1, and credited with how much they made the teacher
prefer the successes' tokens over the failures' (the privileged margin of METHOD 2.5, squashed into [0, 1]).

Writers are a registry (`context.skill.writer`): `extractive` builds the three fields from the group's own texts
(its outcomes, a failed answer and the env's reply to it, the best attempt's actions), without a model; `student`
asks the student itself (greedy, on the rollout workers) to write them from that material, and keeps the extractive
fields where its answer does not parse."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from lopd_ray.data.trajectory import Trajectory


@dataclass
class Skill:
    skill_id: int
    task_id: str        # the task whose rollouts it was written from
    group_id: int
    success_analysis: str
    mistake_analysis: str
    golden_workflow: str
    pulls: int = 0      # groups that were shown it
    credited: int = 0   # of those, the ones whose value came back
    value_sum: float = 0.0

    @property
    def value(self) -> float:
        return self.value_sum / self.credited if self.credited else 0.0


def ucb1_index(skill: Skill, total_pulls: int, c: float) -> float:
    """mean value + c * sqrt(ln N / n); an unexplored skill comes first."""
    if skill.pulls == 0:
        return math.inf
    return skill.value + c * math.sqrt(math.log(max(total_pulls, 1)) / skill.pulls)


def margin_value(members: list[Trajectory]) -> Optional[float]:
    """sigmoid of the group's mean over samples of A * mean over action tokens of (log p_T(a | skill) - the
    student's log p(a), both at the distillation temperature), with A = 2r - 1; None when the teacher scored none
    of them."""
    margins = []
    for t in members:
        if t.teacher_logprobs is None or t.loss_mask.sum() == 0:
            continue
        mask = t.loss_mask.astype(bool)
        gain = (t.teacher_logprobs.astype(np.float64) - t.own_logprobs)[mask].mean()
        margins.append((2.0 * min(max(t.reward, 0.0), 1.0) - 1.0) * gain)
    return 1.0 / (1.0 + math.exp(-float(np.mean(margins)))) if margins else None


def clip(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars].rstrip() + " ..."


def write_extractive(members: list[Trajectory], threshold: float, max_chars: int,
                     response_text: Callable[[Trajectory], str]) -> tuple[str, str, str]:
    """The three fields from the group's own texts."""
    best = max(members, key=lambda t: t.reward)
    successes = [t for t in members if t.reward >= threshold]
    failures = [t for t in members if t.reward < threshold]
    success = (f"{len(successes)} of {len(members)} attempts succeeded; the best one (reward {best.reward:.2f}) "
               f"took {best.num_turns} turn(s).")
    if failures:
        worst = min(failures, key=lambda t: t.reward)
        mistake = f"A failed attempt (reward {worst.reward:.2f}) answered: {clip(response_text(worst), max_chars)}"
        if worst.observation_texts:
            mistake += f"\nIt was told: {clip(worst.observation_texts[-1], max_chars)}"
    else:
        mistake = "No attempt failed."
    steps = [f"{i}. {clip(action, max_chars)}" for i, action in enumerate(response_text(best).split("\n"), 1)]
    return success, mistake, "\n".join(steps)


SKILL_FIELDS = ("success_analysis", "mistake_analysis", "golden_workflow")
_FIELD = re.compile(r"^\s*(success_analysis|mistake_analysis|golden_workflow)\s*:\s*(.*?)(?=^\s*(?:success_analysis|"
                    r"mistake_analysis|golden_workflow)\s*:|\Z)", re.DOTALL | re.MULTILINE | re.IGNORECASE)


def writer_prompt(task_text: str, fields: tuple[str, str, str], max_chars: int) -> str:
    """What the student is asked to summarize: the task and the group's own outcomes, mistakes and best attempt."""
    facts = "\n".join(f"{name}: {value}" for name, value in zip(SKILL_FIELDS, fields))
    return (f"Here are notes on several attempts at a task.\nTask: {clip(task_text, max_chars)}\n{facts}\n\n"
            "Write a reusable skill for similar tasks as three lines, in this format:\nsuccess_analysis: what made "
            "the successful attempts work\nmistake_analysis: what the failed attempts got wrong\ngolden_workflow: "
            "the steps to follow\n")


def parse_skill(text: str) -> Optional[tuple[str, str, str]]:
    """The three fields of a written skill ("name: value" blocks, any order), or None when one is missing/empty."""
    found = {m.group(1).lower(): m.group(2).strip() for m in _FIELD.finditer(text)}
    values = tuple(found.get(name, "") for name in SKILL_FIELDS)
    return values if all(values) else None  # type: ignore[return-value]


class StudentWriter:
    """Skills written by the student: `complete(prompts) -> texts` runs it greedily on the rollout workers."""

    def __init__(self, complete: Callable[[list[str]], list[str]]):
        self.complete = complete
        self.fallbacks = 0

    def write(self, groups: list[list[Trajectory]], threshold: float, max_chars: int,
              response_text: Callable[[Trajectory], str]) -> list[tuple[str, str, str]]:
        material = [write_extractive(members, threshold, max_chars, response_text) for members in groups]
        texts = self.complete([writer_prompt(m[0].task_text, f, max_chars) for m, f in zip(groups, material)])
        written = [parse_skill(text) for text in texts]
        self.fallbacks += sum(w is None for w in written)
        return [w or f for w, f in zip(written, material)]


class ExtractiveWriter:
    fallbacks = 0

    def __init__(self, complete=None):
        pass

    def write(self, groups, threshold, max_chars, response_text):
        return [write_extractive(members, threshold, max_chars, response_text) for members in groups]


SKILL_WRITERS = {"extractive": ExtractiveWriter, "student": StudentWriter}


@dataclass
class SkillLibrary:
    capacity: int
    ucb_c: float
    skills: list[Skill] = field(default_factory=list)
    next_id: int = 0

    @property
    def total_pulls(self) -> int:
        return sum(s.pulls for s in self.skills)

    def add(self, task_id: str, group_id: int, fields: tuple[str, str, str]) -> None:
        """A new skill; when full, the explored skill of the lowest value leaves (or, none explored, the oldest)."""
        if len(self.skills) >= self.capacity:
            explored = [s for s in self.skills if s.credited]
            self.skills.remove(min(explored, key=lambda s: s.value) if explored else self.skills[0])
        self.skills.append(Skill(self.next_id, task_id, group_id, *fields))
        self.next_id += 1

    def choose(self, task_id: str, group_id: int, exclude_own_task: bool) -> Optional[Skill]:
        """The UCB1 choice among the skills the group may see (never one written from the group itself; with
        `exclude_own_task`, none written from the same task), counted as a pull at once so that the groups of one
        step spread over the unexplored skills."""
        eligible = [s for s in self.skills
                    if s.group_id != group_id and not (exclude_own_task and s.task_id == task_id)]
        if not eligible:
            return None
        total = self.total_pulls
        chosen = max(eligible, key=lambda s: ucb1_index(s, total, self.ucb_c))  # ties: the oldest
        chosen.pulls += 1
        return chosen

    def credit(self, skill_id: int, value: float) -> None:
        for s in self.skills:
            if s.skill_id == skill_id:
                s.credited += 1
                s.value_sum += value
