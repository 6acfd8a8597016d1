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


# Submitted one at a time: (prompt, (temperature, top_p, top_k, max_new_tokens, seed)); the last two arrive while
# the first three are generating.
STREAM = [([5 + (i * 11 + j) % 500 for j in range(20 + 10 * i)], (1.0, 1.0, -1, 4 + 6 * (i % 2), 10 + i))
          for i in range(5)]


@ray.remote(num_cpus=0.3)
def run_engine(model_path: str, batches: list[tuple[list, list]], stream: list[tuple[list, tuple]]) -> tuple:
    """One engine: several generate calls ([(prompts, spec tuple per prompt)]); then `stream` submitted request by
    request (the last two after the first collect), collected as they finish; then each stream request alone."""
    from lopd_ray.config import RolloutConfig
    from lopd_ray.rollout.engines.base import SamplingSpec
    from lopd_ray.rollout.engines.vllm_engine import VLLMEngine
    from lopd_ray.utils.runtime import apply_runtime_env

    apply_runtime_env()
    engine = VLLMEngine(model_path, RolloutConfig(max_model_len=4096), "float32", [])
    try:
        generated = [[(g.token_ids, g.logprobs) for g in engine.generate(prompts, [SamplingSpec(*s) for s in specs])]
                     for prompts, specs in batches]
        for key, (prompt, spec) in enumerate(stream[:3]):
            engine.submit(key, prompt, SamplingSpec(*spec))
        collected = engine.collect()
        for key, (prompt, spec) in enumerate(stream[3:], start=3):
            engine.submit(key, prompt, SamplingSpec(*spec))
        while len(collected) < len(stream):
            collected += engine.collect()
        streamed = {key: (g.token_ids, g.logprobs) for key, g in collected}
        alone = [engine.generate([prompt], [SamplingSpec(*spec)])[0] for prompt, spec in stream]
        return generated, [streamed[k] for k in range(len(stream))], [(g.token_ids, g.logprobs) for g in alone]
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def engine_runs(ray_cluster, tiny_model_dir):
    long_specs = [(1.0, 1.0, -1, 8, seed) for seed in (0, 1, 2, 0, 1, 2)]
    filtered_specs = [(TEMPERATURE, 1.0, TOP_K, 8, 7)]
    return ray.get(run_engine.remote(tiny_model_dir, [(LONG_PROMPTS, long_specs), ([FILTERED_PROMPT], filtered_specs)],
                                     STREAM))


@pytest.fixture(scope="module")
def generated(engine_runs):
    return engine_runs[0]


def test_requests_submitted_while_others_generate_sample_as_they_would_alone(engine_runs):
    """rollout.turns=continuous: requests join the running batch as they come and finish on their own; each
    samples the tokens it samples alone (its seed), with the same log-probs."""
    _, streamed, alone = engine_runs
    assert [len(ids) for ids, _ in streamed] == [spec[3] for _, spec in STREAM]
    for (ids, lps), (ids_alone, lps_alone) in zip(streamed, alone):
        assert ids == ids_alone
        assert lps == pytest.approx(lps_alone, abs=1e-5)


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

    from lopd_ray.modeling.logprobs import token_logprobs

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


@ray.remote(num_cpus=0)
def head_size_verdicts(model_dirs: list[str]) -> list:
    from lopd_ray.rollout.engines.vllm_engine import check_head_size

    verdicts = []
    for model_dir in model_dirs:
        try:
            check_head_size(model_dir)
            verdicts.append(None)
        except ValueError as exc:
            verdicts.append(str(exc))
    return verdicts


def test_a_model_whose_head_size_cpu_attention_cannot_run_is_refused_naming_the_fix(tmp_path):
    """Such a model would fail at its first generation, every episode an error; it is refused at start-up."""
    import json

    dirs = []
    for name, head in (("head16", {"head_dim": 16}), ("head32", {"head_dim": 32}), ("derived24", {})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"hidden_size": 48, "num_attention_heads": 2, **head}))
        dirs.append(str(tmp_path / name))
    too_small, fine, derived = ray.get(head_size_verdicts.remote(dirs))
    assert fine is None
    assert "heads of size 16" in too_small and "rollout.engine=hf" in too_small
    assert "heads of size 24" in derived  # hidden_size / heads where config.json gives no head_dim
