"""The vLLM engine inside a Ray worker, as rollout workers run it: prompts longer than one scheduler step's token
budget, with per-request seeds (vLLM's CPU sampler cannot rewind a seeded generator after a chunked prefill), and
what its log-probs mean when top-k filters the sampling distribution."""
from __future__ import annotations

import pytest
import ray
import torch

pytestmark = pytest.mark.ray
LONG_PROMPTS = [[5 + (i * 7 + j) % 900 for j in range(1700)] for i in (0, 1, 2, 0, 1, 2)]  # 10,200 tokens in all
FILTERED_PROMPT = [5 + (3 * j) % 700 for j in range(40)]
TEMPERATURE, TOP_K = 0.7, 3


@ray.remote(num_cpus=0.3)
def generate_batches(model_path: str, batches: list[tuple[list, list]]) -> list[list[tuple[list[int], list[float]]]]:
    """One engine, several generate calls: [(prompts, (temperature, top_p, top_k, max_new_tokens, seed) per prompt)]."""
    from lopd_ray.config import RolloutConfig
    from lopd_ray.rollout.engines.base import SamplingSpec
    from lopd_ray.rollout.engines.vllm_engine import VLLMEngine
    from lopd_ray.utils.runtime import apply_runtime_env

    apply_runtime_env()
    engine = VLLMEngine(model_path, RolloutConfig(max_model_len=4096), "float32", [])
    try:
        return [[(g.token_ids, g.logprobs) for g in engine.generate(prompts, [SamplingSpec(*s) for s in specs])]
                for prompts, specs in batches]
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def generated(ray_cluster, tiny_model_dir):
    long_specs = [(1.0, 1.0, -1, 8, seed) for seed in (0, 1, 2, 0, 1, 2)]
    filtered_specs = [(TEMPERATURE, 1.0, TOP_K, 8, 7)]
    return ray.get(generate_batches.remote(tiny_model_dir, [(LONG_PROMPTS, long_specs),
                                                            ([FILTERED_PROMPT], filtered_specs)]))


def test_long_seeded_prompts_generate_on_cpu(generated):
    out = generated[0]
    assert [len(ids) for ids, _ in out] == [8] * 6
    assert all(len(lps) == 8 and all(lp <= 0.0 for lp in lps) for _, lps in out)
    assert [ids for ids, _ in out[:3]] == [ids for ids, _ in out[3:]]  # same prompt and seed, same sample
    assert len({tuple(ids) for ids, _ in out[:3]}) == 3


def test_rollout_logprobs_are_of_the_filtered_distribution_the_learner_scores_unfiltered(generated, tiny_model_dir):
    """The engine reports log-probs after temperature AND top-k (renormalized over the kept tokens); the learner
    scores the same tokens at the same temperature without the filter, so the two differ even for equal weights."""
    from transformers import AutoModelForCausalLM

    from lopd_ray.learner.logprobs import token_logprobs

    ids, rollout_lps = generated[1][0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    sequence = torch.tensor([FILTERED_PROMPT + ids])
    with torch.no_grad():
        logits = model(input_ids=sequence).logits[0, len(FILTERED_PROMPT) - 1:-1].float() / TEMPERATURE
        learner = token_logprobs(model, sequence, torch.ones_like(sequence), 16, TEMPERATURE)
    learner = learner[0, len(FILTERED_PROMPT) - 1:]
    kept = logits.topk(TOP_K, dim=-1)
    filtered = torch.full_like(logits, float("-inf")).scatter(-1, kept.indices, kept.values).log_softmax(-1)
    sampled = torch.tensor(ids)[:, None]
    torch.testing.assert_close(torch.tensor(rollout_lps), filtered.gather(-1, sampled)[:, 0], atol=1e-4, rtol=0)
    torch.testing.assert_close(learner, logits.log_softmax(-1).gather(-1, sampled)[:, 0], atol=1e-4, rtol=0)
    assert torch.all(torch.tensor(rollout_lps) > learner + 0.1)  # the filtered mass is renormalized upward
