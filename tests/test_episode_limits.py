"""Oversized env replies are cut to rollout.max_observation_chars and counted; an episode whose next turn would not
fit the context ends there, truncated, with the reward of its last step, instead of failing in the engine. The env
steps of a turn run side by side (rollout.env_concurrency)."""
from __future__ import annotations

import threading

from lopd_ray.envs.base import Env, StepResult, Task
from lopd_ray.rollout.agent_loop import Episode, EpisodeLimits, run_episodes, to_trajectory
from lopd_ray.rollout.engines.base import SamplingSpec
from lopd_ray.utils.stats import rollout_metrics
from scripted_agent import CharTokenizer, ScriptedEngine

REPLY_CHARS = 5000


class FloodingEnv(Env):
    """Answers every call with a REPLY_CHARS-character tool output; its reward is the number of calls so far / 10."""

    def reset(self, task):
        self.calls = 0

    def step(self, action_text):
        self.calls += 1
        return StepResult(done=False, reward=self.calls / 10,
                          observation=[{"role": "tool", "content": "x" * REPLY_CHARS}])


def run(limits: EpisodeLimits, turns: int = 4) -> Episode:
    episode = Episode(Task("flood/0", [{"role": "user", "content": "list every file"}]), 0,
                      SamplingSpec(1.0, 1.0, -1, 16, 0), FloodingEnv(max_turns=turns))
    run_episodes(ScriptedEngine(["ls()"] * turns), CharTokenizer(), [episode], limits)
    return episode


def test_long_replies_are_cut_with_a_note_and_counted():
    episode = run(EpisodeLimits(observation_chars=100))
    assert episode.done and episode.error is None and not episode.context_full and episode.reward == 0.4
    assert episode.observations_cut == 3 and len(episode.observation_texts) == 3
    assert episode.observation_texts[0] == "x" * 100 + f"\n[... {REPLY_CHARS - 100} characters cut]"
    uncut = run(EpisodeLimits())
    assert uncut.observations_cut == 0 and len(uncut.observation_texts[0]) == REPLY_CHARS


def test_an_episode_that_would_overflow_the_context_ends_truncated_with_its_last_reward():
    # room for the prompt, two turns and one full reply, not a second reply
    episode = run(EpisodeLimits(context_tokens=REPLY_CHARS + 200))
    assert episode.done and episode.error is None and episode.context_full and episode.truncated
    assert episode.reward == 0.2 and len(episode.turn_spans) == 2 and len(episode.observation_texts) == 1
    assert len(episode.prompt_ids) + len(episode.response_ids) + 16 <= REPLY_CHARS + 200
    metrics = rollout_metrics([to_trajectory(episode, 0, 0), to_trajectory(run(EpisodeLimits(observation_chars=100)), 0, 0)], 0)
    assert metrics["rollout/context_full_frac"] == 0.5 and metrics["rollout/observations_cut"] == 3


class MeetingEnv(Env):
    """Each step waits (up to 3 s) until `parties` steps are in progress at once, then ends the episode with
    reward 1; steps that run one after another never meet and fail."""

    def __init__(self, barrier: threading.Barrier):
        super().__init__(max_turns=1)
        self.barrier = barrier

    def reset(self, task):
        pass

    def step(self, action_text):
        self.barrier.wait(timeout=3)
        return StepResult(done=True, reward=1.0)


def test_the_env_steps_of_a_turn_run_side_by_side():
    def episodes(concurrency: int) -> list[Episode]:
        barrier = threading.Barrier(4)
        eps = [Episode(Task(f"meet/{i}", [{"role": "user", "content": "meet"}]), i, SamplingSpec(1.0, 1.0, -1, 16, i),
                       MeetingEnv(barrier)) for i in range(4)]
        run_episodes(ScriptedEngine(["here"]), CharTokenizer(), eps, EpisodeLimits(concurrent_env_steps=concurrency))
        return eps

    assert [(ep.error, ep.reward) for ep in episodes(4)] == [(None, 1.0)] * 4
    one_at_a_time = episodes(1)  # the first step waits for the others, which never start: it fails, then so do they
    assert all(ep.error and "BrokenBarrierError" in ep.error for ep in one_at_a_time)
