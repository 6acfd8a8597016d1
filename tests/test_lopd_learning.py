"""LOPD learns: on the demo's base model (weak zero-shot, strong with a reference example in its prompt) the
teacher that sees retrieved experience through the composer's latents knows more than the student, the student's
reverse KL to it falls, and the student's reward rises without any reward-driven term in its loss."""
from __future__ import annotations

import os
import random
from statistics import fmean

import pytest
import torch

from lopd_ray.config import ComposerConfig, load_config
from lopd_ray.controller import Controller
from lopd_ray.envs.letters import LettersTasks, letters_reward
from lopd_ray.utils.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def letters_model_dir() -> str:
    """The demo's own builtin model (built on first use into the project's model cache, as `make demo` does)."""
    from lopd_ray.models import resolve_model_path

    return resolve_model_path("builtin:tiny-qwen3-letters")


def mean_reward(model_dir: str, with_reference: bool, samples: int = 48) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lopd_ray.warm_start.letters import warm_start_example

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tasks, framing = LettersTasks("ab", 4, 8, 256, "train"), ComposerConfig()
    rng = random.Random(0)
    torch.manual_seed(0)
    rewards = []
    for i in range(samples):
        messages, _ = warm_start_example(tasks, i, with_reference, rng, (framing.framing_before, framing.framing_after))
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        ids = torch.tensor([prompt["input_ids"]])
        out = model.generate(ids, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=12,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        rewards.append(letters_reward(text, tasks[i].meta["letter"], tasks[i].meta["count"]))
    return sum(rewards) / len(rewards)


def test_demo_base_model_is_better_with_a_reference_example(letters_model_dir):
    zero_shot, with_reference = mean_reward(letters_model_dir, False), mean_reward(letters_model_dir, True)
    assert zero_shot < 0.65 and with_reference > zero_shot + 0.2, (zero_shot, with_reference)


@pytest.mark.ray
def test_lopd_kl_falls_and_reward_rises(ray_cluster, letters_model_dir, tmp_path):
    cfg = load_config(os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml"),
                      [f"model.path={letters_model_dir}", f"run.output_dir={tmp_path}", "run.progress_bar=false",
                       "run.loggers=[]", "train.total_steps=24", "run.checkpoint_every_steps=0",
                       "run.export_student=false", "learner.num_learners=1"])  # the same update (test_learner_dp)
    controller = Controller(cfg)
    try:
        controller.run()
    finally:
        controller.shutdown()
    rows = read_metrics(cfg.run_dir)
    kl = [r["lopd/kl"] for r in rows]
    reward = [r["rollout/reward_mean"] for r in rows]
    first, last = slice(0, 3), slice(-3, None)
    assert fmean(kl[last]) < 0.25 * fmean(kl[first]), kl
    assert fmean(reward[last]) > fmean(reward[first]) + 0.1, reward
    # Each batch starts before its step, once the new weights are on the workers: on-policy all the same.
    assert [r["rollout/stale_samples"] for r in rows] == [0.0] * 24
