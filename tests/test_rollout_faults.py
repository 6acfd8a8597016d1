"""An exception in an env's reset or step, or in the engine, fails that episode only; it is run again up to
rollout.max_retries times, a transient fault heals, a lasting one comes back marked with its error and never trains,
and a step where too many episodes failed stops with one clear error. Faults are injected into the real env and
engine."""
from __future__ import annotations

import os
from collections import Counter

import pytest

from lopd_ray.config import load_config
from lopd_ray.controller import check_failures
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.errors import ActorLostError, ActorStartError, RolloutError
from lopd_ray.rollout.worker import RolloutRequest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FaultyEnv:
    """The real env, raising where the test says: `faults[(where, task_id)]` = how many calls raise (-1: all)."""

    def __init__(self, env, faults: dict, calls: Counter):
        self.env, self.faults, self.calls = env, faults, calls
        self.max_turns = env.max_turns

    def _maybe_raise(self, where: str, task_id: str) -> None:
        self.calls[(where, task_id)] += 1
        budget = self.faults.get((where, task_id), 0)
        if budget == -1 or self.calls[(where, task_id)] <= budget:
            raise RuntimeError(f"injected {where} fault")

    def reset(self, task):
        self.task_id = task.task_id
        self._maybe_raise("reset", task.task_id)
        self.env.reset(task)

    def step(self, action_text):
        self._maybe_raise("step", self.task_id)
        return self.env.step(action_text)

    def syntax_mask(self, action_text):
        return self.env.syntax_mask(action_text)


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    from lopd_ray.rollout.worker import RolloutWorker

    cfg = load_config(os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml"),
                      [f"model.path={tiny_model_dir}", "rollout.engine=hf", "rollout.max_retries=2"])
    return RolloutWorker(cfg, tiny_model_dir)


def test_env_faults_fail_only_their_episode_and_a_transient_one_heals_on_retry(worker, monkeypatch):
    tasks = worker.tasks
    transient, lasting, at_reset = tasks[0].task_id, tasks[1].task_id, tasks[2].task_id
    faults = {("step", transient): 1, ("step", lasting): -1, ("reset", at_reset): -1}
    calls = Counter()
    real = worker.new_env
    monkeypatch.setattr(worker, "new_env", lambda: FaultyEnv(real(), faults, calls))
    trajs = worker.rollout([RolloutRequest(i, i, 100 + i) for i in range(4)])
    by_task = {t.task_id: t for t in trajs}
    assert by_task[transient].error is None and by_task[transient].attempts == 2
    assert by_task[transient].num_action_tokens > 0
    assert by_task[lasting].error == "env step: RuntimeError: injected step fault"
    assert by_task[lasting].attempts == 3 and calls[("step", lasting)] == 3  # the first try and 2 retries
    assert by_task[at_reset].error.startswith("env reset: RuntimeError") and by_task[at_reset].attempts == 3
    clean = by_task[tasks[3].task_id]
    assert clean.error is None and clean.attempts == 1 and calls[("step", tasks[3].task_id)] == 1


def test_a_failing_generation_fails_only_its_episode(worker, monkeypatch):
    from lopd_ray.rollout.agent_loop import render_ids

    bad_prompt = render_ids(worker.tokenizer, worker.tasks[1].messages, add_generation_prompt=True)
    real = worker.engine.generate

    def generate(prompts, specs):
        if any(p[:len(bad_prompt)] == bad_prompt for p in prompts):
            raise ValueError("injected engine fault")
        return real(prompts, specs)

    monkeypatch.setattr(worker.engine, "generate", generate)
    trajs = worker.rollout([RolloutRequest(i, i, 7 + i) for i in range(3)])
    assert [t.error for t in trajs] == [None, "generation: ValueError: injected engine fault", None]
    assert trajs[1].attempts == 3 and len(trajs[1].response_ids) == 0
    assert all(t.num_action_tokens > 0 for t in (trajs[0], trajs[2]))


def failed(n: int) -> list[Trajectory]:
    return [Trajectory(f"task{i}", i, [1], [], [], [], [], 0, error=f"env step: KeyError: {i}", attempts=3)
            for i in range(n)]


def test_a_step_with_too_many_failed_episodes_stops_with_the_first_error():
    cfg = load_config(os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml"), ["rollout.max_failed_fraction=0.25"])
    check_failures(failed(16), 64, cfg.rollout)  # exactly a quarter: the step goes on without them
    check_failures([], 64, cfg.rollout)
    with pytest.raises(RolloutError, match=r"17 of 64 episodes failed after rollout.max_retries=2 retries .*"
                                           r"on task task0: env step: KeyError: 0\. .*rollout.max_failed_fraction"):
        check_failures(failed(17), 64, cfg.rollout)


@pytest.mark.ray
def test_a_dead_or_hung_rollout_worker_is_replaced_and_a_dead_learner_ends_the_run_naming_it(
        ray_cluster, tiny_model_dir, tmp_path):
    import time

    import ray

    from lopd_ray.controller import Controller
    from lopd_ray.utils.timing import StageTimer

    cfg = load_config(os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml"),
                      [f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path}", "rollout.engine=hf",
                       "rollout.num_workers=2", "learner.num_learners=1", "train.prompts_per_step=4",
                       "train.samples_per_prompt=2", "run.progress_bar=false", "run.loggers=[]",
                       "sync.method=collective"])
    controller = Controller(cfg)
    try:
        controller.sync_weights(3, StageTimer())
        dead = controller.workers[0]
        ray.kill(dead)
        trajs, stats = controller.rollout(0)
        assert len(trajs) == 8 and stats["rollout/worker_restarts"] == 1 and controller.workers[0] is not dead
        assert all(t.policy_version == 3 and t.error is None for t in trajs)  # the new worker got the weights
        assert controller.probe_sync()["sync/logprob_diff_max"] <= 1e-2
        # a channel of the new worker alone, then one of both workers again
        controller.sync_weights(4, StageTimer())
        assert controller.weight_sync.channels_opened == 3
        assert controller.probe_sync()["sync/logprob_diff_max"] <= 1e-2
        # a worker that does not answer within the deadline is replaced too
        controller.workers.timeout_s = 3.0
        hung = controller.workers[1]
        hung.__ray_call__.remote(lambda worker: time.sleep(600))
        trajs, stats = controller.rollout(1)
        assert len(trajs) == 8 and stats["rollout/worker_restarts"] == 2 and controller.workers[1] is not hung
        assert all(t.policy_version == 4 for t in trajs)
        # past rollout.max_worker_restarts the step stops, naming the worker and how to go on
        controller.workers.restart.max_restarts = 0
        ray.kill(controller.workers[1])
        with pytest.raises(RolloutError, match=r"RolloutWorker\[1\] died .*run.resume=auto"):
            controller.rollout(2)
        # a learner cannot be replaced mid-run: the run ends naming it and where a resume continues
        ray.kill(controller.learners[0])
        with pytest.raises(ActorLostError, match=r"PolicyLearner\[0\] died .*no checkpoint was written yet"):
            controller.run_or_name_the_lost_actor()
        # a worker still busy (here asleep; after a learner's death, waiting in its weight channel) is killed at
        # shutdown after rollout.shutdown_timeout_s instead of holding the run's end
        controller.cfg.rollout.shutdown_timeout_s = 1.0
        busy = controller.workers[0]
        busy.__ray_call__.remote(lambda worker: time.sleep(600))
        started = time.monotonic()
        controller.shutdown()
        assert time.monotonic() - started < 120
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(busy.__ray_call__.remote(lambda worker: None), timeout=60)
    finally:
        controller.shutdown()


@pytest.mark.ray
def test_an_actor_whose_constructor_raises_stops_the_start_in_one_line_naming_it(ray_cluster, tmp_path):
    from lopd_ray.actors import _group

    class RefusesToStart:  # defined here, so that Ray ships the class itself (the workers cannot import tests/)
        def __init__(self):
            raise ValueError("this model cannot run here: set rollout.engine=hf")

    cfg = load_config(os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml"), [f"run.output_dir={tmp_path}"])
    with pytest.raises(ActorStartError) as info:
        _group(RefusesToStart, cfg, 0, 0, [(), ()])
    assert str(info.value).startswith(("RefusesToStart[0] failed to start: ", "RefusesToStart[1] failed to start: "))
    assert str(info.value).endswith("ValueError: this model cannot run here: set rollout.engine=hf")
