"""The teacher group as the controller sees it: its ranks score contiguous shards of a batch, in order, and the
stages around the score that some methods add (the student's top-M as the support, USD's reveal levels, DOPD's
privileged student, the teacher's own step: LOPD's composer step or DualOPSD's step). The learners' scoring is passed in as
`score_with_learners` and `arrays_from_learners` (the Controller's methods). Per-token arrays go between the actors
by reference (lopd_ray/data/by_reference.py): the group sends views and attaches the references of what the ranks
make. A rank that dies or does not answer within teacher.timeout_s takes the group down: the group's restart
(Controller.rebuild_teachers) puts a new one in place and the call runs again, at most teacher.max_restarts times
in a run."""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

from lopd_ray.data.by_reference import attach_ref, views_with
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.teacher.weights import steps_toward_student
from lopd_ray.utils.actor_group import ActorGroup
# The [R] arrays a teacher rank reads (TeacherWorker, LatentTeacherWorker); the others stay with the driver.
TEACHER_READS = ("response_ids", "loss_mask", "student_logprobs")


class TeacherGroup:
    def __init__(self, cfg, algorithm, teachers: ActorGroup, score_with_learners: Callable[..., list],
                 arrays_from_learners: Callable[..., None]):
        self.cfg, self.algorithm, self.teachers = cfg, algorithm, teachers
        self.score_with_learners, self.arrays_from_learners = score_with_learners, arrays_from_learners

    @property
    def restarts(self) -> int:  # over the run
        return self.teachers.restarts

    def on_every_rank(self, method: str, trajs: list[Trajectory], *args) -> list:
        """`method` of every rank on its shard, the ranks' answers in rank order (see `start`)."""
        return self.start(method, trajs, *args)()

    def start(self, method: str, trajs: list[Trajectory], *args) -> Callable[[], list]:
        """`method` of every rank on its shard, begun now; the function returned waits for the ranks' answers, in
        rank order. A lost group is rebuilt and the call made again. A `*_by_reference` method's blobs are
        attached to the trajectories of their shards."""
        by_reference = method.endswith("_by_reference")

        def launch() -> tuple[list, list, object]:
            shards = self.teachers.split(trajs)
            return list(self.teachers), shards, self.teachers.scatter(
                method, [views_with(part, TEACHER_READS) for part in shards], *args)
        begun = launch()

        def call() -> list:
            nonlocal begun
            # a retry, or a call begun before the group was rebuilt (by a weight sync), goes to the group of now
            _, shards, pending = begun if begun is not None and begun[0] == list(self.teachers) else launch()
            begun = None
            answered = pending.wait()
            for part, blob in zip(shards, pending.blobs) if by_reference else ():
                attach_ref(part, blob)
            return answered
        return lambda: self.teachers.surviving(method, call)

    def call(self, method: str, trajs: list[Trajectory], *args) -> list:
        """`method` of every rank on its shard; the per-trajectory answers in input order."""
        return [answer for part in self.on_every_rank(method, trajs, *args) for answer in part]

    # ---- scoring ---------------------------------------------------------------------------------------------
    def score(self, trajs: list[Trajectory]) -> None:
        """The teacher's log-probs on the support (its own top-M, the student's, or its hidden states for the full
        vocabulary) at every response token, with the privileged context in its prompt; then what the method
        needs besides."""
        algo = self.algorithm
        if algo.support_from_student:
            self.arrays_from_learners([t for t in trajs if t.teacher_context is not None],
                                      "student_topk_by_reference", self.cfg.teacher.top_m)
        for t, score in zip(trajs, self.call("score_by_reference", trajs, algo.needs_teacher_hidden)):
            if score is not None:
                t.teacher_logprobs, t.teacher_entropy = score
        if self.cfg.algorithm.distill.diagnose_context:
            for t, logprobs in zip(trajs, self.call("score_without_context", trajs)):
                t.teacher_plain_logprobs = logprobs
        graded = [t for t in trajs if t.context_levels]
        if graded:
            self.score_context_levels(graded)
        if algo.needs_privileged_student:
            self.score_privileged_student([t for t in trajs if t.teacher_logprobs is not None])

    def score_context_levels(self, trajs: list[Trajectory]) -> None:
        """The teacher's scores under each of a graded provider's contexts (USD's reveal levels); the strongest is
        the one just scored."""
        for t, (sampled, entropy) in zip(trajs, self.call("score_levels_by_reference", trajs), strict=True):
            t.level_logprobs = np.concatenate([sampled, t.teacher_logprobs[None]])
            t.level_entropy = np.concatenate([entropy, t.teacher_entropy[None]])

    def score_privileged_student(self, trajs: list[Trajectory]) -> None:
        """The student's own log-probs of its sampled tokens with the teacher's prompt: the same privileged context,
        the student's weights (DOPD)."""
        views = [dataclasses.replace(t, prompt_ids=prompt, rollout_ref=None)  # its own prompt, sent as it is
                 for t, prompt in zip(trajs, self.call("teacher_prompts", trajs), strict=True)]
        for t, logprobs in zip(trajs, self.score_with_learners(views, at_train_temperature=True)):
            t.privileged_logprobs = logprobs

    def save_checkpoint(self, directory: str) -> None:
        """Every rank's part of a checkpoint; a rank found dead is rebuilt (from the last checkpoint) and saves."""
        self.teachers.surviving("checkpoint", lambda: self.teachers.start("save_checkpoint", directory).wait(
            self.cfg.sync.timeout_s), self.teachers.holds)

    # ---- the teacher's own step ------------------------------------------------------------------------------
    def start_update(self, trajs: list[Trajectory]) -> Optional[tuple[str, Callable[[], dict[str, float]]]]:
        """The teacher's own step after the student's, begun now on every rank: LOPD's composer step, or the
        backbone's step toward the updated student (teacher.weights=dual), whose support the learners score first.
        Neither needs anything the weight sync or the next batch's rollout changes, and the next scoring queues
        behind it on the ranks. Returns its stage name and the function that waits for it (rank 0's metrics), or
        None for a method without one."""
        if self.algorithm.updates_composer:
            finish = self.start("update_composer", trajs)
            return "update_composer", lambda: finish()[0]
        if steps_toward_student(self.cfg.teacher):
            scored = [t for t in trajs if t.teacher_logprobs is not None]
            self.arrays_from_learners(scored, "student_at_support_by_reference")
            finish = self.start("step_toward_student", scored)
            return "teacher_step", lambda: finish()[0]
        return None
