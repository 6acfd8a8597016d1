"""A few decoded samples per step in `rollouts/step_N.jsonl`, for reading what the policy does."""
from __future__ import annotations

import functools
import json
import os

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
                      "prompt": tok.decode(t.prompt_ids), "response": tok.decode(t.response_ids),
                      "response_tokens": tok.convert_ids_to_tokens(t.response_ids),
                      "rollout_logprobs": t.rollout_logprobs, "retrieved_ids": t.retrieved_ids}
            if "teacher_logprobs" in t.info:
                # Per token: how much more the teacher (with its privileged context) likes the sampled token.
                record["teacher_student_gap"] = [round(a - b, 4) for a, b in
                                                 zip(t.info["teacher_logprobs"], t.rollout_logprobs)]
            f.write(json.dumps(record) + "\n")
