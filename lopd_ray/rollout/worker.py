"""RolloutWorker: the student in an inference engine, running episodes and receiving new weights.

What the rollout log-probs mean: the engine's log-prob of each sampled token under the distribution it sampled from,
i.e. after `rollout.temperature` AND the `rollout.top_k` / `rollout.top_p` filters (renormalized over the kept
tokens). The learner scores the same tokens at the same temperature WITHOUT the filters, so with filters on the two
differ even for identical weights. Nothing trains on the rollout log-probs: GRPO's ratio compares the learner's own
log-probs before and after its update; the weight-sync probe samples without filters (`probe`) so that the two
sides compare like with like."""
from __future__ import annotations

import os
from dataclasses import dataclass

from lopd_ray.envs import make_env
from lopd_ray.modeling.weights_io import verify
from lopd_ray.rollout.agent_loop import Episode, EpisodeLimits, render_ids, run_episodes, to_trajectory
from lopd_ray.rollout.engines import engine_class
from lopd_ray.rollout.engines.base import SamplingSpec
from lopd_ray.utils.runtime import single_thread_torch

# train.mode=async: how much lower the rollout workers' CPU priority is than the learners' and the teacher's, where
# they share cores.
ASYNC_NICENESS = 5


@dataclass
class RolloutRequest:
    task_index: int
    group_id: int
    seed: int


class RolloutWorker:
    def __init__(self, cfg, model_path: str):
        single_thread_torch()
        from transformers import AutoTokenizer

        self.cfg = cfg
        if cfg.train.mode == "async":  # the batch in flight yields the CPU to the step that trains (engine included)
            os.nice(ASYNC_NICENESS)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.new_env, self.tasks = make_env(cfg.env)
        stop_ids = [self.tokenizer.eos_token_id]
        self.engine = engine_class(cfg.rollout.engine)(model_path, cfg.rollout, cfg.model.dtype, stop_ids)
        self.limits = EpisodeLimits(cfg.rollout.max_model_len or None, cfg.rollout.max_observation_chars,
                                    cfg.rollout.env_concurrency)
        self.policy_version = 0
        self.held_out = None  # (env factory, tasks) of eval.split, made on the first held-out evaluation

    def _run(self, requests: list[RolloutRequest], spec_for_seed, env=None) -> list:
        """One episode per request of `env` ((env factory, tasks); default the training split's); an episode that
        failed is run again from the start (a fresh env, the next seed), up to rollout.max_retries times, and
        comes back with its last error if it never succeeded."""
        new_env, tasks = env or (self.new_env, self.tasks)
        trajs, pending = [None] * len(requests), list(range(len(requests)))
        for attempt in range(self.cfg.rollout.max_retries + 1):
            episodes = [Episode(tasks[requests[i].task_index], requests[i].group_id,
                                spec_for_seed(requests[i].seed + attempt), new_env()) for i in pending]
            run_episodes(self.engine, self.tokenizer, episodes, self.limits, self.cfg.rollout.turns)
            for i, ep in zip(pending, episodes):
                trajs[i] = to_trajectory(ep, requests[i].task_index, self.policy_version, attempt + 1)
            pending = [i for i, ep in zip(pending, episodes) if ep.error]
            if not pending:
                break
        return trajs

    def rollout(self, requests: list[RolloutRequest]):
        ro = self.cfg.rollout
        return self._run(requests, lambda seed: SamplingSpec(ro.temperature, ro.top_p, ro.top_k, ro.max_new_tokens,
                                                             seed))

    def probe(self, requests: list[RolloutRequest], max_new_tokens: int):
        """Sampling at the rollout temperature without top-k/top-p, whose log-probs the learner can recompute."""
        temperature = self.cfg.rollout.temperature
        return self._run(requests, lambda seed: SamplingSpec(temperature, 1.0, -1, max_new_tokens, seed))

    def evaluate(self, requests: list[RolloutRequest], temperature: float, env=None):
        """Evaluation episodes (of `env`, default the env's split): temperature 0 is greedy decoding."""
        ro = self.cfg.rollout
        return self._run(requests, lambda seed: SamplingSpec(temperature, ro.top_p, ro.top_k, ro.max_new_tokens, seed),
                         env)

    def evaluate_held_out(self, requests: list[RolloutRequest]):
        """Evaluation episodes on the tasks of eval.split, each in an env of that split, at eval.temperature."""
        if self.held_out is None:
            self.held_out = make_env(self.cfg.held_out_env)
        return self.evaluate(requests, self.cfg.eval.temperature, self.held_out)

    def complete(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy answers of the student to single user messages (e.g. writing a skill); a prompt that leaves no
        room to answer within rollout.max_model_len gets ""."""
        ids = [render_ids(self.tokenizer, [{"role": "user", "content": p}], add_generation_prompt=True)
               for p in prompts]
        limit = self.cfg.rollout.max_model_len or float("inf")
        fits = [i for i, p in enumerate(ids) if len(p) + max_new_tokens <= limit]
        spec = SamplingSpec(0.0, 1.0, -1, max_new_tokens, 0)
        generations = self.engine.generate([ids[i] for i in fits], [spec] * len(fits)) if fits else []
        texts = [""] * len(prompts)
        for i, gen in zip(fits, generations):
            texts[i] = self.tokenizer.decode([t for t in gen.token_ids if t != self.tokenizer.eos_token_id])
        return texts

    def update_weights(self, version: int, export: dict) -> dict:
        """`export` is rank 0's `PolicyLearner.export_weights()` (Ray resolves the reference)."""
        bad = verify(export["payload"], export["checksums"])
        if bad:
            return {"version": self.policy_version, "corrupt": bad}
        self.engine.load_weights(export["payload"])
        self.policy_version = version
        return {"version": version, "corrupt": []}

    def open_weight_channel(self, channel: dict, first_rank: int) -> None:
        self.engine.open_weight_channel(channel, first_rank)

    def receive_weights(self, version: int, buckets: list) -> dict:
        """sync.method=collective: the weights rank 0 broadcasts now (checked by the sync probe, not per tensor)."""
        self.engine.receive_weights(buckets)
        self.policy_version = version
        return {"version": version, "corrupt": []}

    def shutdown(self) -> None:
        self.engine.shutdown()
