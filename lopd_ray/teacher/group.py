"""The teacher group as the controller sees it: its ranks score contiguous shards of a batch, in order; the scorers
the algorithm names (data/signals.py: the teacher's scores, the student's top-M as the support, USD's reveal levels,
DOPD's privileged student) run on the teachers or the learners; and the teacher's own step (LOPD's composer step or
DualOPSD's step). The learners' side is passed in as `on_learners` (Controller.on_learners). Per-token arrays go
between the actors by reference (lopd_ray/data/by_reference.py): the group sends views and attaches the references
of what the ranks make. A rank that dies or does not answer within teacher.timeout_s takes the group down: the
group's restart (Controller.rebuild_teachers) puts a new one in place and the call runs again, at most
teacher.max_restarts times in a run."""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from lopd_ray.data.by_reference import attach_ref, fill_rows, views_with
from lopd_ray.data.signals import APPLIES_TO, LEARNER, SCORERS, SIGNALS, TEACHER, TEACHER_STEPS, Scorer, read_by
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.teacher.weights import weight_steps
from lopd_ray.utils.actor_group import ActorGroup

# The [R] arrays a teacher rank reads (TeacherWorker, LatentTeacherWorker); the others stay with the driver.
TEACHER_READS = ("response_ids", "loss_mask") + read_by(TEACHER)
# Per rank (or learner plan): the trajectories it was sent, its answer, and its blob (None: the method returns one
# object).
Answers = list[tuple[list[Trajectory], object, object]]


class TeacherGroup:
    def __init__(self, cfg, algorithm, teachers: ActorGroup, on_learners: Callable[..., Answers],
                 context_scorers: tuple[str, ...] = ()):
        """`context_scorers`: what the context provider reads besides (ContextProvider.scorers), run after the
        algorithm's."""
        self.cfg, self.algorithm, self.teachers, self.on_learners = cfg, algorithm, teachers, on_learners
        self.context_scorers = context_scorers

    @property
    def restarts(self) -> int:  # over the run
        return self.teachers.restarts

    def start(self, method: str, trajs: list[Trajectory], *args) -> Callable[[], Answers]:
        """`method` of every rank on its shard, begun now; the function returned waits for the ranks, in rank
        order. A lost group is rebuilt and the call made again."""
        def launch() -> tuple[list, list, object]:
            shards = self.teachers.split(trajs)
            return list(self.teachers), shards, self.teachers.scatter(
                method, [views_with(part, TEACHER_READS) for part in shards], *args)
        begun = launch()

        def call() -> Answers:
            nonlocal begun
            # a retry, or a call begun before the group was rebuilt (by a weight sync), goes to the group of now
            _, shards, pending = begun if begun is not None and begun[0] == list(self.teachers) else launch()
            begun = None
            return list(zip(shards, pending.wait(), pending.blobs))
        return lambda: self.teachers.surviving(method, call)

    def on_teachers(self, trajs: list[Trajectory], method: str, *args) -> Answers:
        return self.start(method, trajs, *args)()

    def call(self, method: str, trajs: list[Trajectory], *args) -> list:
        """`method` of every rank on its shard; the per-trajectory answers in input order."""
        return [answer for _, part, _ in self.on_teachers(trajs, method, *args) for answer in part]

    # ---- scoring ---------------------------------------------------------------------------------------------
    def score(self, trajs: list[Trajectory]) -> None:
        """The algorithm's scorers, in its order: the teacher's log-probs on the support (its own top-M, the
        student's, or its hidden states for the full vocabulary) at every response token, with the privileged
        context in its prompt, then what the method and its context provider need besides."""
        for name in dict.fromkeys(self.algorithm.scorers() + self.context_scorers):
            self.run(SCORERS[name], trajs)

    def run(self, scorer: Scorer, trajs: list[Trajectory]) -> None:
        """One scorer on the trajectories it applies to: the signals it writes, the driver's filled in and the
        wide ones' blobs attached."""
        chosen = [t for t in trajs if APPLIES_TO[scorer.applies_to](t)]
        by_uid = {t.uid: t for t in chosen}
        if len(by_uid) != len(chosen):
            raise ValueError("the trajectories a scorer runs on need distinct uids (Trajectory.uid)")
        sent = chosen  # even none: every rank runs every scorer, and a scorer's call resets what the step keeps
        if scorer.teacher_prompt:  # each with its teacher prompt as its own, sent as it is
            sent = [dataclasses.replace(t, prompt_ids=prompt, rollout_ref=None)
                    for t, prompt in zip(chosen, self.call("teacher_prompts", chosen), strict=True)]
        compute = {LEARNER: self.on_learners, TEACHER: self.on_teachers}[scorer.actor]
        wide = any(SIGNALS[name].by_reference for name in scorer.writes)
        for part, rows, blob in compute(sent, scorer.method, *scorer.args(self.cfg)):
            originals = [by_uid[t.uid] for t in part]
            fill_rows(originals, rows)
            if wide:
                attach_ref(originals, blob)

    def start_held_out(self, probes: list[Trajectory]) -> Callable[[], list[float]]:
        """eval.teacher: the teacher's greedy episodes of held-out tasks under the probes' contexts, spread over the
        ranks and begun now; the function returned waits for their rewards, in the probes' order."""
        finish = self.start("play_held_out", probes)
        return lambda: [reward for _, rewards, _ in finish() for reward in rewards]

    def save_checkpoint(self, directory: str) -> None:
        """Every rank's part of a checkpoint; a rank found dead is rebuilt (from the last checkpoint) and saves."""
        self.teachers.surviving("checkpoint", lambda: self.teachers.start("save_checkpoint", directory).wait(
            self.cfg.run.checkpoint_timeout_s), self.teachers.holds)

    # ---- the teacher's own step ------------------------------------------------------------------------------
    def steps(self) -> tuple[str, ...]:
        """The teacher's own steps (data/signals.TEACHER_STEPS): the algorithm's, then its weight policy's."""
        return self.algorithm.teacher_steps() + weight_steps(self.cfg.teacher)

    def start_update(self, trajs: list[Trajectory]) -> Optional[tuple[str, Callable[[], dict[str, float]]]]:
        """The teacher's own steps after the student's, begun now on every rank, in order, each after the scorers it
        needs (LOPD's composer step; the backbone's step toward the updated student, teacher.weights=dual). None
        needs anything the weight sync or the next batch's rollout changes, and the next scoring queues behind them
        on the ranks. Returns their stage name and the function that waits for them (rank 0's metrics, and the
        algorithm's from them: its dual variable), or None when there are none."""
        names = self.steps()
        if not names:
            return None
        begun = []
        for name in names:
            step = TEACHER_STEPS[name]
            for scorer in step.before:
                self.run(SCORERS[scorer], trajs)
            chosen = [t for t in trajs if APPLIES_TO[step.applies_to](t)]
            begun.append((name, self.start(step.method, chosen, *self.algorithm.teacher_step_args(name))))

        def finish() -> dict[str, float]:
            metrics: dict[str, float] = {}
            for name, wait in begun:
                answer = wait()[0][1]
                metrics.update({**answer, **self.algorithm.after_teacher_step(name, answer)})
            return metrics
        return "+".join(TEACHER_STEPS[name].stage for name in names), finish
