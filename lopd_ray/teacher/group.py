"""The teacher group as the controller sees it: its ranks score contiguous shards of a batch, in order, and the
stages around the score that some methods add (the student's top-M as the support, USD's reveal levels, DOPD's
privileged student, LOPD's composer step, DualOPSD's teacher step). The learners' scoring is passed in as
`score_with_learners` (Controller.score_with_learners). A rank that dies or does not answer within
teacher.timeout_s takes the group down: `rebuild()` (Controller.rebuild_teachers) puts a new one in place and the
call runs again, at most teacher.max_restarts times in a run."""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, TypeVar

from ray.exceptions import RayActorError

from lopd_ray.data.trajectory import Trajectory
from lopd_ray.utils.waiting import DeadlineError, wait_all

log = logging.getLogger(__name__)
T = TypeVar("T")


class TeacherGroup:
    def __init__(self, cfg, algorithm, teachers: list, score_with_learners: Callable[..., list],
                 rebuild: Callable[[], None]):
        self.cfg, self.algorithm, self.teachers = cfg, algorithm, teachers
        self.score_with_learners, self.rebuild = score_with_learners, rebuild
        self.restarts = 0  # over the run

    def shards(self, trajs: list[Trajectory]) -> list[list[Trajectory]]:
        """Contiguous shards, one per teacher rank, in order (a rank may get none)."""
        shard = -(-len(trajs) // len(self.teachers))
        return [trajs[i * shard:(i + 1) * shard] for i in range(len(self.teachers))]

    def on_every_rank(self, method: str, trajs: list[Trajectory], *args) -> list:
        """`method` of every rank on its shard, the ranks' answers in rank order; a lost group is rebuilt and the
        call made again."""
        def call() -> list:
            calls = [getattr(t, method).remote(part, *args) for t, part in zip(self.teachers, self.shards(trajs))]
            return wait_all(calls, self.cfg.teacher.timeout_s, f"teacher {method}",
                            [f"TeacherWorker[{i}]" for i in range(len(calls))], setting="teacher.timeout_s")
        return self.survive(method, call, lambda exc: True)

    def survive(self, what: str, call: Callable[[], T], lost_here: Callable[[Exception], bool]) -> T:
        """`call()`; when it fails because a rank was lost (`lost_here(exc)`: a rank died or is late), the group is
        rebuilt and the call made again, at most teacher.max_restarts times in a run."""
        while True:
            try:
                return call()
            except (RayActorError, DeadlineError) as exc:
                if not lost_here(exc) or self.restarts >= self.cfg.teacher.max_restarts:
                    raise  # the run ends naming the actor (Controller.run_or_name_the_lost_actor)
                self.restarts += 1
                log.warning("teacher group lost during %s (%s); rebuilding it from the last checkpoint",
                            what, str(exc).splitlines()[0][:200])
                self.rebuild()

    def died(self, exc: Exception) -> bool:
        """Whether `exc` says that one of the group's ranks died."""
        ranks = {t._actor_id.hex() for t in self.teachers}
        return isinstance(exc, RayActorError) and getattr(exc, "actor_id", None) in ranks

    def call(self, method: str, trajs: list[Trajectory], *args) -> list:
        """`method` of every rank on its shard; the per-trajectory answers in input order."""
        return [answer for part in self.on_every_rank(method, trajs, *args) for answer in part]

    def call_all(self, method: str, trajs: list[Trajectory]) -> dict[str, float]:
        """A step every rank takes together on its shard; rank 0's metrics."""
        return self.on_every_rank(method, trajs)[0]

    # ---- scoring ---------------------------------------------------------------------------------------------
    def score(self, trajs: list[Trajectory]) -> None:
        """The teacher's log-probs on the support (its own top-M, the student's, or its hidden states for the full
        vocabulary) at every response token, with the privileged context in its prompt; then what the method
        needs besides."""
        algo = self.algorithm
        if algo.support_from_student:
            with_context = [t for t in trajs if t.teacher_context is not None]
            supports = self.score_with_learners(with_context, student_topk=self.cfg.teacher.top_m)
            for t, ids in zip(with_context, supports):
                t.support_ids = ids
        for t, score in zip(trajs, self.call("score", trajs, algo.needs_teacher_hidden)):
            if score is not None:
                t.teacher_topm_ids, t.teacher_topm_logprobs, t.teacher_logprobs = score[:3]
                t.teacher_hidden = score[3] if algo.needs_teacher_hidden else None
        if self.cfg.algorithm.distill.diagnose_context:
            for t, logprobs in zip(trajs, self.call("score_without_context", trajs)):
                t.teacher_plain_logprobs = logprobs
        graded = [t for t in trajs if t.context_levels]
        if graded:
            self.score_context_levels(graded)
        if algo.needs_privileged_student:
            self.score_privileged_student([t for t in trajs if t.teacher_topm_ids is not None])

    def score_context_levels(self, trajs: list[Trajectory]) -> None:
        """The teacher's scores under each of a graded provider's contexts (USD's reveal levels); the strongest is
        the one just scored."""
        levels = len(trajs[0].context_levels)
        for t in trajs:
            t.level_scores = [None] * (levels - 1) + [(t.teacher_topm_ids, t.teacher_topm_logprobs,
                                                        t.teacher_logprobs)]
        for k in range(levels - 1):
            views = [dataclasses.replace(t, teacher_context=t.context_levels[k]) for t in trajs]
            for t, score in zip(trajs, self.call("score", views), strict=True):
                t.level_scores[k] = score

    def score_privileged_student(self, trajs: list[Trajectory]) -> None:
        """The student's own log-probs of its sampled tokens with the teacher's prompt: the same privileged context,
        the student's weights (DOPD)."""
        views = [dataclasses.replace(t, prompt_ids=prompt)
                 for t, prompt in zip(trajs, self.call("teacher_prompts", trajs), strict=True)]
        for t, logprobs in zip(trajs, self.score_with_learners(views, at_train_temperature=True)):
            t.privileged_logprobs = logprobs

    def save_checkpoint(self, directory: str) -> None:
        """Every rank's part of a checkpoint; a rank found dead is rebuilt (from the last checkpoint) and saves."""
        def call() -> list:
            return wait_all([t.save_checkpoint.remote(directory) for t in self.teachers], self.cfg.sync.timeout_s,
                            "checkpoint", [f"TeacherWorker[{i}]" for i in range(len(self.teachers))])
        self.survive("checkpoint", call, self.died)

    # ---- the teacher's own steps -----------------------------------------------------------------------------
    def update_composer(self, trajs: list[Trajectory]) -> dict[str, float]:
        return self.call_all("update_composer", trajs)

    def step_toward_student(self, trajs: list[Trajectory]) -> dict[str, float]:
        """The teacher's own step toward the updated student, on the same trajectories (teacher.weights=dual)."""
        scored = [t for t in trajs if t.teacher_topm_ids is not None]
        for t, student_topm in zip(scored, self.score_with_learners(scored, at_teacher_topm=True)):
            t.student_topm_logprobs = student_topm
        return self.call_all("step_toward_student", scored)
