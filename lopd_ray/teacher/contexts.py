"""Context providers: what the self-teacher sees besides the task (METHOD.md sections 1 and 3).

A provider runs on the controller after the rollout and gives each trajectory a `TeacherContext` (text for the
teacher's prompt and where it goes), or None when it has nothing for that sample (the sample then carries no
distillation signal). The teacher worker renders the context with the student's own chat template, so an empty
context gives exactly the student's prompt. Providers are chosen by `context.name`; each reads its own
`context.<name>` section, whose framing texts default to the published wording of the method that introduced it.
"""
from __future__ import annotations

import dataclasses
import random
import re
from typing import Optional

from lopd_ray.data.groups import by_group
from lopd_ray.data.trajectory import TeacherContext, Trajectory
from lopd_ray.errors import require
from lopd_ray.teacher.framings import op2sd as op2sd_framing
from lopd_ray.teacher.framings import opsd as opsd_framing
from lopd_ray.teacher.framings import sdpo as sdpo_framing
from lopd_ray.teacher.injection import latent_context
from lopd_ray.teacher.skills import SKILL_WRITERS, Skill, SkillLibrary, margin_value

_THINKING = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def strip_thinking(text: str) -> str:
    return _THINKING.sub("", text).strip()


def response_text(t: Trajectory) -> str:
    """A trajectory's own answer as a demonstration: its actions, thinking removed, one per line."""
    return "\n".join(strip_thinking(a) for a in t.action_texts)


def retrieve(bank, trajs: list[Trajectory], k: int, exclude_own: bool) -> list[list]:
    """The bank's top-k entries for each trajectory's task text (its own task's excluded unless not
    `exclude_own`)."""
    return bank.first("retrieve", [t.task_text for t in trajs], k, [t.task_id if exclude_own else None for t in trajs])


def sample_rng(seed: int, step: int, uid: int) -> random.Random:
    """A per-sample stream: the same run draws the same contexts after a resume."""
    return random.Random(f"{seed}/{step}/{uid}")


class ContextProvider:
    needs_bank = False
    uses_latents = False
    needs_reference_solutions = False
    # Config sections this provider reads besides its own `context.<name>`.
    reads: tuple[str, ...] = ()
    # Scorers (data/signals.SCORERS) the provider's `observe` needs after the algorithm's.
    scorers: tuple[str, ...] = ()

    @classmethod
    def check(cls, cfg, tasks) -> None:
        """Its checks of the whole Config before any actor starts (`tasks()` gives the train split's TaskSource,
        built only when asked for): a ConfigError naming the key and the fix."""

    def __init__(self, cfg, tasks, bank=None, student=None):
        """`student(prompts, max_new_tokens) -> texts`: greedy completions by the student, for providers that
        write with it."""
        self.cfg, self.tasks, self.bank, self.student = cfg, tasks, bank, student

    def attach(self, trajs: list[Trajectory], step: int) -> dict[str, float]:
        """Sets `teacher_context` on every trajectory (None: no context for it); returns metrics."""
        self.prepare(trajs)
        for t in trajs:
            t.teacher_context = self.context_for(t, step)
        return {"context/missing": float(sum(t.teacher_context is None for t in trajs))}

    def prepare(self, trajs: list[Trajectory]) -> None:
        """What the batch as a whole gives the contexts (siblings, retrieved experience), once per step."""

    def observe(self, trajs: list[Trajectory]) -> dict[str, float]:
        """After the teacher scored the batch: what the provider learns from the scores; returns metrics."""
        return {}

    def state_dict(self) -> dict:
        """What a resumed run needs to choose the same contexts (saved in the controller's checkpoint state)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

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
        solution = self.tasks.reference_solution(t.task_index)
        return opsd_framing(self.cfg, t.task_text, solution) if solution else None


class WrongKindContext(ContextProvider):
    """A control: OPSD's framing around the verified solution of a task of ANOTHER kind (`task.meta["kind"]`),
    drawn at random per sample: the teacher sees content that should mislead it."""
    needs_reference_solutions = True
    reads = ("context.oracle",)

    @classmethod
    def check(cls, cfg, tasks) -> None:
        split = tasks()
        require(not len(split) or "kind" in split[0].meta,
                f"context.name=wrong_kind needs tasks that name their kind (env.name=rules); env.name={cfg.env.name}'s "
                f"do not: choose another context.name")

    def context_for(self, t, step):
        kind = self.tasks[t.task_index].meta["kind"]
        rng = sample_rng(self.cfg.train.seed, step, t.uid)
        for _ in range(64):
            index = rng.randrange(len(self.tasks))
            if self.tasks[index].meta.get("kind") != kind:
                return opsd_framing(self.cfg, "", self.tasks.reference_solution(index))
        return None


class EmptyOracleContext(ContextProvider):
    """A control: OPSD's framing with nothing in it, where the task's solution would be."""
    reads = ("context.oracle",)

    def context_for(self, t, step):
        return opsd_framing(self.cfg, "", "")


class RevealContext(ContextProvider):
    """USD, known from its abstract only: the task's verified solution revealed in part, at each of
    `context.reveal.levels` (fractions of its characters, weakest first); `teacher_context` is the strongest level
    and `context_levels` all of them, each scored by the teacher."""
    needs_reference_solutions = True

    def context_for(self, t, step):
        own = self.cfg.context.reveal
        solution = self.tasks.reference_solution(t.task_index)
        if not solution:
            t.context_levels = None
            return None
        t.context_levels = [TeacherContext(own.framing.format(solution=solution[:round(level * len(solution))]),
                                           own.placement) for level in own.levels]
        return t.context_levels[-1]


class OtherProblemContext(ContextProvider):
    """Another task of the split with its verified solution, drawn at random per sample, never the task itself or a
    task with the same text (OP2SD)."""
    needs_reference_solutions = True

    def context_for(self, t, step):
        rng = sample_rng(self.cfg.train.seed, step, t.uid)
        for _ in range(64):
            index = rng.randrange(len(self.tasks))
            other = self.tasks[index]
            solution = self.tasks.reference_solution(index)
            if index != t.task_index and other.user_text != t.task_text and solution:
                return op2sd_framing(self.cfg, other.user_text, solution)
        return None


# Entries asked for per task: a split may repeat a task's text many times, and those are never shown.
RETRIEVED_CANDIDATES = 32


class RetrievedProblemContext(ContextProvider):
    """OP2SD with a retrieved example: the bank's entry most similar to the task (its seeded reference solutions and
    the student's successes), never the task itself or a task with the same text; `context.other_problem`'s
    framing."""
    needs_bank = True
    reads = ("bank", "context.other_problem")

    def prepare(self, trajs):
        found = retrieve(self.bank, trajs, RETRIEVED_CANDIDATES, exclude_own=True)
        self.examples = {id(t): next((e for e in entries if e.task_id != t.task_id and e.task_text != t.task_text),
                                     None) for t, entries in zip(trajs, found)}

    def context_for(self, t, step):
        example = self.examples.get(id(t))
        return None if example is None else op2sd_framing(self.cfg, example.task_text, example.trace_text)


class SiblingContext(ContextProvider):
    """A successful rollout of the same group (never the sample itself, thinking removed), and/or, where no sibling
    succeeded, the environment's feedback on the sample's own failed attempt (SDPO)."""

    @classmethod
    def check(cls, cfg, tasks) -> None:
        threshold = cfg.context.sibling.success_threshold
        require(0.0 < threshold <= 1.0, f"context.sibling.success_threshold={threshold} must be in (0, 1]: a reward "
                                        f"at or above it makes a sibling a success")

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
        if successes:
            return sdpo_framing(self.cfg, t.task_text, sample_rng(self.cfg.train.seed, step, t.uid).choice(successes))
        if own.use_feedback and t.reward < own.success_threshold and t.observation_texts:
            return TeacherContext(own.feedback_framing.format(feedback=t.observation_texts[-1]) + own.closing,
                                  own.placement)
        return None


class HintContext(ContextProvider):
    """H2SD, known from its abstract only: a success sees its own response with a rephrasing instruction (the
    teacher's probabilities then re-weight its tokens' credit), a failure the task's verified solution as a hint."""
    needs_reference_solutions = True

    @classmethod
    def check(cls, cfg, tasks) -> None:
        threshold = cfg.algorithm.distill.success_threshold
        require(0.0 < threshold <= 1.0, f"algorithm.distill.success_threshold={threshold} must be in (0, 1]: "
                                        f"context.name=hint shows a success (reward at or above it) its own "
                                        f"response, a failure the task's solution")

    def context_for(self, t, step):
        own = self.cfg.context.hint
        if t.reward >= self.cfg.algorithm.distill.success_threshold:
            return TeacherContext(own.success_framing.format(response=response_text(t)), own.placement)
        solution = self.tasks.reference_solution(t.task_index)
        return TeacherContext(own.failure_framing.format(solution=solution), own.placement) if solution else None


class SkillContext(ContextProvider):
    """Skill-SD: a skill {success_analysis, mistake_analysis, golden_workflow} written from the agent's own groups of
    rollouts (this step's included, never the group's own), chosen per task by UCB1 on how much each skill raised the
    teacher's privileged margin (lopd_ray.teacher.skills)."""
    scorers = ("student_own",)  # the margin compares the teacher with the student's own log-probs

    def __init__(self, cfg, tasks, bank=None, student=None):
        super().__init__(cfg, tasks, bank, student)
        own = cfg.context.skill
        self.library = SkillLibrary(own.library_size, own.ucb_c)
        self.writer = SKILL_WRITERS[own.writer](lambda prompts: student(prompts, own.writer_max_tokens))
        self.shown: dict[int, Skill] = {}  # group id -> the skill its samples' teacher saw this step

    def prepare(self, trajs):
        own, all_groups = self.cfg.context.skill, by_group(trajs)
        groups = [m for m in all_groups.values() if max(t.reward for t in m) >= own.success_threshold]
        # the groups with the most successes first: their workflow is the most trusted
        groups = sorted(groups, key=lambda m: -sum(t.reward >= own.success_threshold for t in m))[:own.writes_per_step]
        for members, fields in zip(groups, self.writer.write(groups, own.success_threshold, own.max_chars,
                                                             response_text)):
            self.library.add(members[0].task_id, members[0].group_id, fields)
        self.shown = {}
        for group_id, members in all_groups.items():
            skill = self.library.choose(members[0].task_id, group_id, own.exclude_own_task)
            if skill is not None:
                self.shown[group_id] = skill

    def context_for(self, t, step):
        own, skill = self.cfg.context.skill, self.shown.get(t.group_id)
        if skill is None:
            return None
        return TeacherContext(own.framing.format(success_analysis=skill.success_analysis,
                                                 mistake_analysis=skill.mistake_analysis,
                                                 golden_workflow=skill.golden_workflow), own.placement)

    def observe(self, trajs):
        groups = by_group(trajs)
        for group_id, skill in self.shown.items():
            value = margin_value(groups[group_id])
            if value is not None:
                self.library.credit(skill.skill_id, value)
        explored = [s.value for s in self.library.skills if s.credited]
        return {"skill/library_size": float(len(self.library.skills)),
                "skill/value_mean": float(sum(explored) / len(explored)) if explored else 0.0,
                "skill/writer_fallbacks": float(self.writer.fallbacks)}

    def state_dict(self):
        return {"skills": [dataclasses.asdict(s) for s in self.library.skills], "next_id": self.library.next_id}

    def load_state_dict(self, state):
        self.library.skills = [Skill(**s) for s in state["skills"]]
        self.library.next_id = state["next_id"]


class LatentContext(ContextProvider):
    """LOPD: the top-J successful experiences of the bank (never the same task unless bank.self_retrieval), which
    the teacher's composer turns into latent tokens between the composer's framing texts."""
    needs_bank = True
    uses_latents = True
    reads = ("bank", "composer")

    def __init__(self, cfg, tasks, bank=None, student=None):
        from lopd_ray.bank.traces import ComposerInputs

        super().__init__(cfg, tasks, bank, student)
        self.inputs = ComposerInputs(cfg.composer, cfg.model.path)

    def prepare(self, trajs):
        bc = self.cfg.bank
        found = retrieve(self.bank, trajs, bc.top_j, exclude_own=not bc.self_retrieval)
        for t, entries in zip(trajs, found):
            t.retrieved_ids = [e.entry_id for e in entries]
            t.retrieved_texts = self.inputs.texts(t.task_text, entries)

    def context_for(self, t, step):
        return latent_context(self.cfg.composer) if t.retrieved_ids else None


CONTEXTS: dict[str, type[ContextProvider]] = {
    "none": NoContext,
    "oracle": OracleContext,
    "wrong_kind": WrongKindContext,
    "empty_oracle": EmptyOracleContext,
    "other_problem": OtherProblemContext,
    "retrieved_problem": RetrievedProblemContext,
    "reveal": RevealContext,
    "sibling": SiblingContext,
    "hint": HintContext,
    "skill": SkillContext,
    "latent": LatentContext,
}


def make_context(cfg, tasks, bank=None, student=None) -> ContextProvider:
    return CONTEXTS[cfg.context.name](cfg, tasks, bank, student)
