"""The vLLM engine inside a Ray worker, as rollout workers run it: prompts longer than one scheduler step's token
budget, with per-request seeds (vLLM's CPU sampler cannot rewind a seeded generator after a chunked prefill)."""
from __future__ import annotations

import pytest
import ray

pytestmark = pytest.mark.ray


@ray.remote(num_cpus=0.3)
def generate_long_prompts(model_path: str) -> list[tuple[list[int], list[float]]]:
    from lopd_ray.config import RolloutConfig
    from lopd_ray.rollout.engines.base import SamplingSpec
    from lopd_ray.rollout.engines.vllm_engine import VLLMEngine
    from lopd_ray.utils.runtime import apply_runtime_env

    apply_runtime_env()
    engine = VLLMEngine(model_path, RolloutConfig(max_model_len=4096), "float32", [])
    prompts = [[5 + (i * 7 + j) % 900 for j in range(1700)] for i in (0, 1, 2, 0, 1, 2)]  # 10,200 tokens in all
    specs = [SamplingSpec(1.0, 1.0, -1, 8, seed) for seed in (0, 1, 2, 0, 1, 2)]
    try:
        return [(g.token_ids, g.logprobs) for g in engine.generate(prompts, specs)]
    finally:
        engine.shutdown()


def test_long_seeded_prompts_generate_on_cpu(ray_cluster, tiny_model_dir):
    out = ray.get(generate_long_prompts.remote(tiny_model_dir))
    assert [len(ids) for ids, _ in out] == [8] * 6
    assert all(len(lps) == 8 and all(lp <= 0.0 for lp in lps) for _, lps in out)
    assert [ids for ids, _ in out[:3]] == [ids for ids, _ in out[3:]]  # same prompt and seed, same sample
    assert len({tuple(ids) for ids, _ in out[:3]}) == 3
