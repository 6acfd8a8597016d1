"""A few decoded samples per step in `rollouts/step_N.jsonl`, for reading what the policy does.

One JSON object per line: task_id, reward, policy_version, prompt and response (decoded text), response_tokens
(one string per response token), rollout_logprobs (per response token, 0.0 on observation tokens), retrieved_ids
and retrieved_texts (bank entries and the text the composer read of each, or null), teacher_context (the text a
context provider showed the teacher, or null), and where a teacher scored the trajectory, teacher_student_gap (per
response token: the teacher's log-prob of the sampled token minus the rollout's). Episodes that failed after their retries (an env or
engine exception) go to `rollouts/step_N_failed.jsonl` with their error and number of attempts."""
from __future__ import annotations

import functools
import json
import os

import numpy as np

from lopd_ray.data.trajectory import Trajectory


@functools.lru_cache(maxsize=4)
def _tokenizer(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def dump_rollouts(run_dir: str, step: int, trajs: list[Trajectory], count: int, model_path: str) -> None:
    if count <= 0:
        return
    tok = _tokenizer(model_path)
    os.makedirs(os.path.join(run_dir, "rollouts"), exist_ok=True)
    with open(os.path.join(run_dir, "rollouts", f"step_{step}.jsonl"), "w") as f:
        for t in trajs[:count]:
            record = {"task_id": t.task_id, "reward": t.reward, "policy_version": t.policy_version,
                      "prompt": tok.decode(t.prompt_ids.tolist()), "response": tok.decode(t.response_ids.tolist()),
                      "response_tokens": tok.convert_ids_to_tokens(t.response_ids.tolist()),
                      "rollout_logprobs": t.rollout_logprobs.tolist(), "retrieved_ids": t.retrieved_ids,
                      "retrieved_texts": t.retrieved_texts,
                      "teacher_context": t.teacher_context.text if t.teacher_context is not None else None}
            if t.teacher_logprobs is not None:
                # Per token: how much more the teacher (with its privileged context) likes the sampled token.
                gap = t.teacher_logprobs.astype(np.float64) - t.rollout_logprobs
                record["teacher_student_gap"] = [round(g, 4) for g in gap.tolist()]
            f.write(json.dumps(record) + "\n")


def dump_failed_rollouts(run_dir: str, step: int, failed: list[Trajectory], model_path: str) -> None:
    """Every episode of the step that failed after its retries, with its error, to rollouts/step_N_failed.jsonl."""
    if not failed:
        return
    tok = _tokenizer(model_path)
    os.makedirs(os.path.join(run_dir, "rollouts"), exist_ok=True)
    with open(os.path.join(run_dir, "rollouts", f"step_{step}_failed.jsonl"), "w") as f:
        for t in failed:
            f.write(json.dumps({"task_id": t.task_id, "error": t.error, "attempts": t.attempts,
                                "prompt": tok.decode(t.prompt_ids.tolist()),
                                "response": tok.decode(t.response_ids.tolist())}) + "\n")
