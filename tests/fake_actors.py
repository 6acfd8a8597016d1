"""In-process stand-ins for the run's actors, for tests of the controller alone: an inline transport that runs a call
when it is submitted, and actors that write each call they get into one shared journal and answer with arrays of the
right shapes. They compute nothing a method's maths depends on."""
from __future__ import annotations

import os

import numpy as np

from lopd_ray.bank.traces import BankEntry
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.utils.actor_group import ActorGroup

RESPONSE = 3  # tokens in every fake response


class Done:
    """The outcome of a call that already ran, standing where an object reference would."""

    def __init__(self, value=None, error=None):
        self.value, self.error = value, error


class InlineTransport:
    def submit(self, actor, method: str, args: tuple):
        args = tuple(a.value if isinstance(a, Done) else a for a in args)  # a reference passed on arrives resolved
        try:
            answer = getattr(actor, method)(*args)
        except Exception as exc:  # raised when the answer is asked for, as Ray does
            return Done(error=exc)
        if getattr(getattr(actor, method), "two_objects", False):  # what the driver reads, the blob it passes on
            return Done(answer[0]), Done(answer[1])
        return Done(answer)

    def wait(self, refs: list, timeout_s: float) -> tuple[list, list]:
        return refs[:1], refs[1:]

    def get(self, refs):
        if isinstance(refs, list):
            return [self.get(ref) for ref in refs]
        if refs.error is not None:
            raise refs.error
        return refs.value

    def kill(self, actor) -> None:
        actor.killed = True

    def actor_id(self, actor) -> str:
        return str(id(actor))

    def lost_actor(self, exc: BaseException):
        return None

    def dead(self, actors: list, timeout_s: float) -> list[bool]:
        return [getattr(actor, "killed", False) for actor in actors]

    def remove_placement(self, placement) -> None:
        pass


INLINE = InlineTransport()


def two_objects(method):
    """Marks a fake's method as one that returns two objects (`@ray.method(num_returns=2)` on the real actor)."""
    method.two_objects = True
    return method


class Fake:
    """Every public call is written to `journal` as (kind, method) before it runs."""

    kind = ""

    def __init__(self, journal: list):
        self.journal, self.killed = journal, False

    def __getattribute__(self, name: str):
        value = object.__getattribute__(self, name)
        if callable(value) and not name.startswith("_") or name == "__ray_ready__":
            object.__getattribute__(self, "journal").append((type(self).kind, name))
        return value

    def __ray_ready__(self):
        return True


def trajectory(request, version: int, reward: float) -> Trajectory:
    return Trajectory(task_id=f"letters/train/{request.task_index}", group_id=request.group_id,
                      prompt_ids=np.arange(1, 5), response_ids=np.arange(5, 5 + RESPONSE),
                      loss_mask=np.ones(RESPONSE, dtype=np.int64), turn_spans=[(0, RESPONSE)],
                      rollout_logprobs=np.full(RESPONSE, -0.5, dtype=np.float32), policy_version=version,
                      reward=reward, task_index=request.task_index, task_text=f"task {request.task_index}",
                      action_texts=["abc"])


class FakeRolloutWorker(Fake):
    kind = "RolloutWorker"
    version = -1

    def rollout(self, requests):
        return [trajectory(r, self.version, float(r.seed % 2)) for r in requests]

    def evaluate_held_out(self, requests):
        return [trajectory(r, self.version, 1.0) for r in requests]

    def probe(self, requests, max_new_tokens):
        return [trajectory(r, self.version, 0.0) for r in requests]

    def complete(self, prompts, max_new_tokens):
        return ["an answer" for _ in prompts]

    def update_weights(self, version, export):
        self.version = version
        return {"corrupt": [], "version": version}

    def shutdown(self):
        return None


def plan_trajectories(plan) -> list[Trajectory]:
    return [t for update in plan.minibatches for micro in update for t in micro]


class FakeLearner(Fake):
    kind = "PolicyLearner"

    @two_objects
    def train_step_by_reference(self, plan, norms):
        trajs = plan_trajectories(plan)
        tokens = float(RESPONSE * len(trajs))  # the views carry no arrays: the rollout ships them by reference
        return ({"actor/tokens": tokens, "actor/loss": 0.0},
                {t.uid: {"student_logprobs": np.full(RESPONSE, -0.5, dtype=np.float32)} for t in trajs}), {}

    @two_objects
    def student_scores_at_support(self, plan):
        return {}, {}

    @two_objects
    def student_scores(self, plan, name):
        return {t.uid: {name: np.full(RESPONSE, -0.5, dtype=np.float32)} for t in plan_trajectories(plan)}, {}

    def score(self, plan, at_teacher_topm=False, at_train_temperature=False):
        return [np.full(RESPONSE, -0.5) for _ in plan_trajectories(plan)]

    def export_weights(self):
        return {"payload": b"", "checksums": {}}

    def save_checkpoint(self, directory):
        with open(os.path.join(directory, "learner.txt"), "w") as f:
            f.write("fake")

    def load_checkpoint(self, directory):
        return None


class FakeTeacher(Fake):
    kind = "TeacherWorker"

    @two_objects
    def teacher_scores(self, trajs, *with_hidden):
        return {t.uid: {"teacher_logprobs": np.full(RESPONSE, -0.25, dtype=np.float32),
                        "teacher_entropy": np.full(RESPONSE, 1.0, dtype=np.float32)}
                for t in trajs if t.teacher_context is not None}, {}

    @two_objects
    def teacher_scores_at_levels(self, trajs):
        return {t.uid: {"level_logprobs": np.full((len(t.context_levels) - 1, RESPONSE), -0.5, dtype=np.float32),
                        "level_entropy": np.ones((len(t.context_levels) - 1, RESPONSE), dtype=np.float32)}
                for t in trajs}, {}

    def teacher_prompts(self, trajs):
        return [[1, 2] for _ in trajs]

    def play_held_out(self, probes):
        return [1.0 for _ in probes]

    def update_composer(self, trajs, beta, margin):
        return {"lopd/delta": 0.1, "lopd/kl": 0.2}

    def step_toward_student(self, trajs):
        return {"teacher/step_divergence": 0.1}

    def save_checkpoint(self, directory):
        return None

    def load_checkpoint(self, directory):
        return None


class FakeBank(Fake):
    kind = "ExperienceBank"

    def __init__(self, journal):
        super().__init__(journal)
        self.entries: list[BankEntry] = []

    def add(self, entries):
        self.entries += entries

    def retrieve(self, task_texts, k, exclude_task_ids):
        return [[e for e in self.entries if e.task_id != exclude][:k] for exclude in exclude_task_ids]

    def stats(self):
        return {"bank/size": float(len(self.entries))}

    def size(self):
        return len(self.entries)

    def snapshot(self, directory):
        return None

    def restore(self, directory):
        return None


def fake_group(cls, count: int, journal: list, cfg, renew=None) -> ActorGroup:
    from lopd_ray.actors import group_settings

    return ActorGroup(cls.kind, [cls(journal) for _ in range(count)], transport=INLINE,
                      **group_settings(cls.kind, cfg, renew))
