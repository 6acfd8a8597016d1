"""The controller's tests run on the stand-ins of tests/fake_actors.py: each stand-in's method takes the parameters
of the real actor's method of that name, so that a change of a real signature fails here, not silently there."""
from __future__ import annotations

import inspect

import pytest

import fake_actors
from lopd_ray.bank.bank import ExperienceBank
from lopd_ray.learner.policy_learner import PolicyLearner
from lopd_ray.rollout.worker import RolloutWorker
from lopd_ray.teacher.latent_worker import LatentTeacherWorker

# stand-in -> the real actor classes whose methods it stands in for (LOPD's teacher has the plain teacher's and more)
REAL = {fake_actors.FakeRolloutWorker: (RolloutWorker,), fake_actors.FakeLearner: (PolicyLearner,),
        fake_actors.FakeTeacher: (LatentTeacherWorker,), fake_actors.FakeBank: (ExperienceBank,)}


def parameters(method) -> list[tuple[str, object]]:
    """Names and kinds after self (a *args the same as any run of positional parameters it stands for). Ray adds
    `_ray_trace_ctx` to a class's methods in place once any process-local `ray.remote` has wrapped it."""
    return [(p.name, p.kind) for p in list(inspect.signature(method).parameters.values())[1:]
            if p.name != "_ray_trace_ctx"]


@pytest.mark.parametrize("fake", list(REAL), ids=lambda cls: cls.__name__)
def test_every_stand_in_method_takes_the_real_actors_parameters(fake):
    own = {name: member for name, member in vars(fake).items()  # its own methods, not what a test set on it
           if inspect.isfunction(member) and member.__module__ == fake_actors.__name__ and not name.startswith("_")}
    assert own, fake
    for name, method in own.items():
        real = next((getattr(cls, name) for cls in REAL[fake] if hasattr(cls, name)), None)
        assert real is not None, f"{fake.__name__}.{name}: no real actor has this method"
        stand_in = parameters(method)
        if any(kind is inspect.Parameter.VAR_POSITIONAL for _, kind in stand_in):
            fixed = [n for n, kind in stand_in if kind is not inspect.Parameter.VAR_POSITIONAL]
            assert [n for n, _ in parameters(real)][:len(fixed)] == fixed, (fake.__name__, name)
        else:
            assert [n for n, _ in stand_in] == [n for n, _ in parameters(real)], (fake.__name__, name)
