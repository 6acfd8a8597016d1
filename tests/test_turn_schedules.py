"""rollout.turns: in lockstep, a turn waits for every env step of the one before; continuously, an episode's next
turn goes to the engine as soon as its own step returns. Both end every episode the same way."""
from __future__ import annotations

import threading

import pytest

from lopd_ray.envs.base import Env, StepResult, Task
from lopd_ray.rollout.agent_loop import Episode, EpisodeLimits, run_episodes, to_trajectory
from lopd_ray.rollout.engines.base import Generation, InferenceEngine, SamplingSpec
from scripted_agent import EOS, CharTokenizer


class EchoEngine(InferenceEngine):
    """Answers each prompt with 'call' and the number of turns the prompt holds; fails on a prompt containing
    'boom'. Records the batches it was asked for."""

    def __init__(self):
        super().__init__("", None, "float32", [EOS])
        self.batches: list[int] = []

    def generate(self, prompts, specs):
        self.batches.append(len(prompts))
        if any("boom" in "".join(chr(i - 10) for i in p if i > EOS) for p in prompts):
            raise RuntimeError("the engine failed on a prompt")
        return [self._answer(p) for p in prompts]

    @staticmethod
    def _answer(prompt) -> Generation:
        ids = [ord(c) + 10 for c in f"call{prompt.count(EOS)}"] + [EOS]
        return Generation(ids, [-0.5] * len(ids), "stop")

    def load_weights(self, payload):
        raise NotImplementedError

    def open_weight_channel(self, channel, first_rank):
        raise NotImplementedError

    def receive_weights(self, buckets):
        raise NotImplementedError


class CountingEnv(Env):
    """Done after `steps` steps (reward = steps / 10); raises at step `fail_at`; its reply is long when `flood`."""

    def __init__(self, steps: int, fail_at: int = 0, flood: int = 0):
        super().__init__(max_turns=5)
        self.steps, self.fail_at, self.flood = steps, fail_at, flood

    def reset(self, task):
        self.calls = 0

    def step(self, action_text):
        self.calls += 1
        if self.calls == self.fail_at:
            raise ValueError("the tool crashed")
        return StepResult(done=self.calls == self.steps, reward=self.calls / 10,
                          observation=[{"role": "tool", "content": f"ok {action_text}" + "x" * self.flood}])


def episodes() -> list[Episode]:
    envs = [CountingEnv(1), CountingEnv(3), CountingEnv(9), CountingEnv(4, fail_at=2), CountingEnv(9, flood=300),
            CountingEnv(2)]
    texts = ["a", "b", "c", "d", "e", "boom"]
    return [Episode(Task(f"t/{i}", [{"role": "user", "content": text}]), i, SamplingSpec(1.0, 1.0, -1, 8, i), env)
            for i, (env, text) in enumerate(zip(envs, texts))]


@pytest.mark.parametrize("turns", ["lockstep", "continuous"])
def test_both_schedules_end_every_episode_the_same_way(turns):
    """Episodes of 1, 3 and 5 (max_turns) turns, an env that raises, one that fills the context and a prompt the
    engine fails on: the same trajectories either way, field by field."""
    engine = EchoEngine()
    eps = episodes()
    run_episodes(engine, CharTokenizer(), eps, EpisodeLimits(context_tokens=600, concurrent_env_steps=4), turns)
    got = [to_trajectory(ep, 0, 0) for ep in eps]
    assert [t.reward for t in got] == [0.1, 0.3, 0.5, 0.0, 0.2, 0.0]
    assert [len(t.turn_spans) for t in got] == [1, 3, 5, 2, 2, 0]
    assert got[3].error == "env step: ValueError: the tool crashed" and "engine failed" in got[5].error
    assert got[4].context_full and got[4].truncated
    reference = episodes()
    run_episodes(EchoEngine(), CharTokenizer(), reference, EpisodeLimits(context_tokens=600, concurrent_env_steps=4))
    for t, ref in zip(got, [to_trajectory(ep, 0, 0) for ep in reference]):
        assert (t.response_ids.tolist(), t.loss_mask.tolist(), t.rollout_logprobs.tolist(), t.turn_spans,
                t.action_texts, t.observation_texts, t.error) == \
               (ref.response_ids.tolist(), ref.loss_mask.tolist(), ref.rollout_logprobs.tolist(), ref.turn_spans,
                ref.action_texts, ref.observation_texts, ref.error)


class GateEnv(Env):
    """The slow episode's first step waits until the fast episode has taken all its steps (at most 2 s)."""

    def __init__(self, steps: int, fast_done: threading.Event, slow: bool):
        super().__init__(max_turns=steps)
        self.steps, self.fast_done, self.slow = steps, fast_done, slow

    def reset(self, task):
        self.calls = 0

    def step(self, action_text):
        self.calls += 1
        if self.slow:
            return StepResult(done=True, reward=float(self.fast_done.wait(timeout=2)))
        if self.calls == self.steps:
            self.fast_done.set()
        return StepResult(done=self.calls == self.steps, reward=1.0,
                          observation=[{"role": "tool", "content": "ok"}])


@pytest.mark.parametrize("turns, fast_went_on", [("lockstep", False), ("continuous", True)])
def test_continuously_an_episode_does_not_wait_for_another_episodes_step(turns, fast_went_on):
    fast_done = threading.Event()
    eps = [Episode(Task(f"g/{i}", [{"role": "user", "content": "go"}]), i, SamplingSpec(1.0, 1.0, -1, 8, i),
                   GateEnv(3, fast_done, slow=i == 0)) for i in range(2)]
    run_episodes(EchoEngine(), CharTokenizer(), eps, EpisodeLimits(concurrent_env_steps=2), turns)
    slow, fast = eps
    assert len(fast.turn_spans) == 3 and fast.error is None
    assert slow.reward == float(fast_went_on)  # continuously, the fast one's 3 turns ran during the slow step
