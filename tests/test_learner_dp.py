"""The DeepSpeed learner group: data parallelism and ZeRO stages must not change the update."""
from __future__ import annotations

import os
import random

import pytest
import ray
import torch

from lopd_ray.actors import build_learners
from lopd_ray.config import load_config
from lopd_ray.data.batching import plan_learner_batches
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.modeling.weights_io import deserialize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.ray


def batch(seed: int = 0, n: int = 10) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(10, 1000) for _ in range(rng.randint(3, 12))]
        response = [rng.randrange(10, 1000) for _ in range(rng.randint(2, 20))]
        mask = [1 if rng.random() > 0.2 else 0 for _ in response]
        adv = rng.uniform(-1, 1)
        out.append(Trajectory(f"t{i}", i // 2, prompt, response, mask, [(0, len(response))], [0.0] * len(response),
                              0, advantages=[adv * m for m in mask]))
    return out


def train_once(tiny_model_dir, num_learners: int, zero_stage: int, budget: int, updates_per_step: int = 1,
               extra: tuple[str, ...] = ()):
    cfg = load_config(os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml"),
                      [f"model.path={tiny_model_dir}", f"learner.num_learners={num_learners}",
                       f"learner.zero_stage={zero_stage}", "learner.cpus_per_learner=0.2",
                       f"learner.max_tokens_per_micro_batch={budget}", "learner.logprob_chunk_tokens=7",
                       # A large eps makes Adam's first step linear in the gradient, so that rounding-level
                       # differences of near-zero gradients are not amplified to +-lr.
                       "learner.adam_eps=1.0", "learner.grad_clip=0.5",
                       "train.prompts_per_step=2", "train.samples_per_prompt=2", "rollout.num_workers=1",
                       "rollout.max_model_len=64", f"learner.updates_per_step={updates_per_step}", *extra])
    learners = build_learners(cfg, tiny_model_dir)
    try:
        plans, norms = plan_learner_batches(batch(), num_learners, updates_per_step, budget)
        metrics = [m for m, _ in ray.get([l.train_step.remote(p, norms) for l, p in zip(learners, plans)])]
        exports = ray.get([l.export_weights.remote() for l in learners])
    finally:
        learners.release()
    return metrics[0], deserialize(exports[0]["payload"])


def test_data_parallel_and_zero_stages_give_the_single_process_update(ray_cluster, tiny_model_dir):
    from concurrent.futures import ThreadPoolExecutor

    setups = ((1, 0, 4096), (2, 2, 64), (2, 3, 96))  # (learners, ZeRO stage, token budget): the groups side by side
    with ThreadPoolExecutor(len(setups)) as pool:
        (ref_metrics, ref), *others = pool.map(lambda setup: train_once(tiny_model_dir, *setup), setups)
    for (_, stage, _), (metrics, weights) in zip(setups[1:], others):
        # The gradient norm is scale-sensitive (Adam's step is not): it checks the global token normalization.
        assert metrics["actor/grad_norm"] == pytest.approx(ref_metrics["actor/grad_norm"], rel=1e-5), stage
        for name, tensor in ref.items():
            assert torch.allclose(weights[name], tensor, atol=1e-6, rtol=0), (stage, name)
        assert any(not torch.equal(ref[n], deserialize_initial(tiny_model_dir)[n]) for n in ref)


_initial = {}


def deserialize_initial(model_dir: str) -> dict[str, torch.Tensor]:
    if model_dir not in _initial:
        from safetensors.torch import load_file
        _initial[model_dir] = load_file(os.path.join(model_dir, "model.safetensors"))
    return _initial[model_dir]


def test_later_mini_batches_measure_the_ratio_against_the_weights_that_sampled(ray_cluster, tiny_model_dir):
    """With two optimizer steps per batch, the second mini-batch's old log-probs are those of the weights before
    the first step, so after a large first step its PPO ratio leaves [1 - eps, 1 + eps] and clipping acts; old
    log-probs taken at the start of each mini-batch would keep the ratio at 1 (clip fraction 0)."""
    metrics, _ = train_once(tiny_model_dir, 1, 0, 4096, updates_per_step=2,
                            extra=("learner.lr=0.05", "learner.adam_eps=1.0e-8", "learner.grad_clip=100.0"))
    assert metrics["actor/clipfrac"] > 0.05
