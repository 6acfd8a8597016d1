"""Context providers: what the self-teacher sees besides the task (METHOD.md sections 1 and 3).

A provider runs on the controller after the rollout and gives each trajectory a `TeacherContext` (text for the
teacher's prompt and where it goes), or None when it has nothing for that sample (the sample then carries no
distillation signal). The teacher worker renders the context with the student's own chat template, so an empty
context gives exactly the student's prompt. Providers are chosen by `context.name`; each reads its own
`context.<name>` section, whose framing texts default to the published wording of the method that introduced it.
"""
from __future__ import annotations

import random
import re
from typing import Optional

from lopd_ray.data.trajectory import TeacherContext, Trajectory
from lopd_ray.teacher.injection import latent_context

_THINKING = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def strip_thinking(text: str) -> str:
    return _THINKING.sub("", text).strip()


def response_text(t: Trajectory) -> str:
    """A trajectory's own answer as a demonstration: its actions, thinking removed, one per line."""
    return "\n".join(strip_thinking(a) for a in t.action_texts)


def sample_rng(seed: int, step: int, uid: int) -> random.Random:
    """A per-sample stream: the same run draws the same contexts after a resume."""
    return random.Random(f"{seed}/{step}/{uid}")


class ContextProvider:
    needs_bank = False
    uses_latents = False
    needs_reference_solutions = False
    # Config sections this provider reads besides its own `context.<name>`.
    reads: tuple[str, ...] = ()

    def __init__(self, cfg, tasks, bank=None):
        self.cfg, self.tasks, self.bank = cfg, tasks, bank

    def attach(self, trajs: list[Trajectory], step: int) -> dict[str, float]:
        """Sets `teacher_context` on every trajectory (None: no context for it); returns metrics."""
        self.prepare(trajs)
        for t in trajs:
            t.teacher_context = self.context_for(t, step)
        return {"context/missing": float(sum(t.teacher_context is None for t in trajs))}

    def prepare(self, trajs: list[Trajectory]) -> None:
        """What the batch as a whole gives the contexts (siblings, retrieved experience), once per step."""

    def context_for(self, t: Trajectory, step: int) -> Optional[TeacherContext]:
        raise NotImplementedError


class NoContext(ContextProvider):
    """The teacher sees the task only (generic on-policy distillation from a different teacher; ablations)."""

    def context_for(self, t, step):
        return TeacherContext("", "user_suffix")


class OracleContext(ContextProvider):
    """The task's own verified solution (OPSD; SDFT as an appended demonstration)."""
    needs_reference_solutions = True

    def context_for(self, t, step):
        own = self.cfg.context.oracle
        solution = self.tasks.reference_solution(t.task_index)
        return TeacherContext(own.framing.format(solution=solution), own.placement) if solution else None


class OtherProblemContext(ContextProvider):
    """Another task of the split with its verified solution, drawn at random per sample, never the task itself or a
    task with the same text (OP2SD)."""
    needs_reference_solutions = True

    def context_for(self, t, step):
        own = self.cfg.context.other_problem
        rng = sample_rng(self.cfg.train.seed, step, t.uid)
        for _ in range(64):
            index = rng.randrange(len(self.tasks))
            other = self.tasks[index]
            solution = self.tasks.reference_solution(index)
            if index != t.task_index and other.user_text != t.task_text and solution:
                return TeacherContext(own.framing.format(problem=other.user_text, solution=solution), own.placement)
        return None


class SiblingContext(ContextProvider):
    """A successful rollout of the same group (never the sample itself, thinking removed), and/or, where no sibling
    succeeded, the environment's feedback on the sample's own failed attempt (SDPO)."""

    def prepare(self, trajs):
        """Per group, its successes and their demonstration texts."""
        threshold = self.cfg.context.sibling.success_threshold
        self.successes: dict[int, list[tuple[Trajectory, str]]] = {}
        for s in trajs:
            text = response_text(s) if s.reward >= threshold else ""
            if text:
                self.successes.setdefault(s.group_id, []).append((s, text))

    def context_for(self, t, step):
        own = self.cfg.context.sibling
        successes = [text for s, text in self.successes.get(t.group_id, []) if s is not t]
        parts = []
        if successes:
            chosen = sample_rng(self.cfg.train.seed, step, t.uid).choice(successes)
            parts.append(own.solution_framing.format(solution=chosen))
        elif own.use_feedback and t.reward < own.success_threshold and t.observation_texts:
            parts.append(own.feedback_framing.format(feedback=t.observation_texts[-1]))
        if not parts:
            return None
        return TeacherContext("".join(parts) + own.closing, own.placement)


class HintContext(ContextProvider):
    """H2SD, known from its abstract only: a success sees its own response with a rephrasing instruction (the
    teacher's probabilities then re-weight its tokens' credit), a failure the task's verified solution as a hint."""
    needs_reference_solutions = True

    def context_for(self, t, step):
        own = self.cfg.context.hint
        if t.reward >= self.cfg.algorithm.distill.success_threshold:
            return TeacherContext(own.success_framing.format(response=response_text(t)), own.placement)
        solution = self.tasks.reference_solution(t.task_index)
        return TeacherContext(own.failure_framing.format(solution=solution), own.placement) if solution else None


class LatentContext(ContextProvider):
    """LOPD: the top-J successful experiences of the bank (never the same task unless bank.self_retrieval), which
    the teacher's composer turns into latent tokens between the composer's framing texts."""
    needs_bank = True
    uses_latents = True
    reads = ("bank", "composer")

    def prepare(self, trajs):
        import ray

        from lopd_ray.bank.traces import composer_input_text

        bc = self.cfg.bank
        exclude = [None if bc.self_retrieval else t.task_id for t in trajs]
        found = ray.get(self.bank.retrieve.remote([t.task_text for t in trajs], bc.top_j, exclude))
        for t, entries in zip(trajs, found):
            t.retrieved_ids = [e.entry_id for e in entries]
            t.retrieved_texts = [composer_input_text(e) for e in entries]

    def context_for(self, t, step):
        return latent_context(self.cfg.composer) if t.retrieved_ids else None


CONTEXTS: dict[str, type[ContextProvider]] = {
    "none": NoContext,
    "oracle": OracleContext,
    "other_problem": OtherProblemContext,
    "sibling": SiblingContext,
    "hint": HintContext,
    "latent": LatentContext,
}


def make_context(cfg, tasks, bank=None) -> ContextProvider:
    return CONTEXTS[cfg.context.name](cfg, tasks, bank)
