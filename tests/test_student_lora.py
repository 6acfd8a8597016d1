"""The student's LoRA adapter (`learner.lora`): only A and B train, and every receiver gets W + alpha / rank * B A."""
from __future__ import annotations

import os
import sys

import pytest
import ray
import torch
from torch import nn

from lopd_ray.config import StudentLoraConfig, load_config
from lopd_ray.errors import ConfigError
from lopd_ray.modeling.student_lora import (add_student_adapter, check_targets, hf_parameters, is_adapter_parameter,
                                           merged_layers)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The state read inside the learner actor is a function of this module, which actors cannot import.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(2, 2, bias=False)
        self.out = nn.Linear(2, 2, bias=False)


def adapted_two_layers(**lora) -> TwoLayers:
    """rank 1, alpha 2 (scaling 2) on q_proj, W = [[1, 2], [3, 4]], A = [[1, -1]], B = [[1], [2]]."""
    model = TwoLayers()
    add_student_adapter(model, StudentLoraConfig(**{"rank": 1, "alpha": 2.0, "targets": ["q_proj"], **lora}))
    with torch.no_grad():
        model.q_proj.base_layer.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        model.q_proj.lora_A["student"].weight.copy_(torch.tensor([[1.0, -1.0]]))
        model.q_proj.lora_B["student"].weight.copy_(torch.tensor([[1.0], [2.0]]))
    return model


def test_the_merged_weight_is_the_base_plus_alpha_over_rank_times_b_a():
    model = adapted_two_layers()
    # B A = [[1, -1], [2, -2]]; times alpha / rank = 2: [[2, -2], [4, -4]]; plus W: [[3, 0], [7, 0]].
    expected = torch.tensor([[3.0, 0.0], [7.0, 0.0]])
    assert list(merged_layers(model)) == ["q_proj.weight"]
    assert torch.equal(merged_layers(model)["q_proj.weight"], expected)
    # The receivers' names are the plain model's; the base weight itself is left as it was.
    assert sorted(hf_parameters(model)) == ["out.weight", "q_proj.weight"]
    assert torch.equal(hf_parameters(model)["q_proj.weight"], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    # The adapted layer computes what the merged weight does: x W'^T, with x = [1, 2] -> [3, 7].
    assert torch.equal(model.q_proj(torch.tensor([[1.0, 2.0]])), torch.tensor([[3.0, 7.0]]))
    trainable = sorted(name for name, p in model.named_parameters() if p.requires_grad)
    assert trainable == ["q_proj.lora_A.student.weight", "q_proj.lora_B.student.weight"]


def test_the_adapter_dropout_acts_in_training_only():
    x = torch.tensor([[1.0, 2.0]])
    torch.manual_seed(0)
    dropped = adapted_two_layers(dropout=0.5).train()
    outputs = {tuple(dropped.q_proj(x)[0].tolist()) for _ in range(32)}
    # Without the adapter's path: x W^T = [5, 11]; the path alone, its input doubled by dropout 0.5 where kept:
    # x = [2, 0] -> 2 * B A x = [4, 8]; x = [0, 4] -> [-8, -16]; x = [2, 4] -> [-4, -8].
    assert outputs <= {(5.0, 11.0), (9.0, 19.0), (-3.0, -5.0), (1.0, 3.0)} and len(outputs) > 1
    assert torch.equal(dropped.eval().q_proj(x), torch.tensor([[3.0, 7.0]]))
    kept = adapted_two_layers(dropout=0.0).train()
    assert torch.equal(kept.q_proj(x), torch.tensor([[3.0, 7.0]]))


def test_targets_must_name_hidden_linear_layers_of_the_model(tiny_model_dir):
    check_targets(tiny_model_dir, StudentLoraConfig(rank=4, targets=["q_proj", "self_attn.v_proj", "down_proj"]))
    for targets, says in ((["q_proj", "qproj"], "'qproj' names no layer"),
                          (["lm_head"], "'lm_head' names a layer that is not a hidden linear layer"),
                          (["embed_tokens"], "'embed_tokens' names a layer that is not")):
        with pytest.raises(ConfigError, match=says) as info:
            check_targets(tiny_model_dir, StudentLoraConfig(rank=4, targets=targets))
        assert "q_proj" in str(info.value)  # the layers it could name


def test_a_recipe_with_a_bad_adapter_is_refused_in_one_line(capsys, tmp_path):
    from lopd_ray.cli.train import main

    recipe = os.path.join(REPO, "recipes", "opsd_letters_cpu.yaml")
    for override, says in (("learner.lora.targets=[q_proj,qproj]", "'qproj' names no layer"),
                           ("learner.lora.targets=[]", "adapts nothing"),
                           ("learner.lora.dropout=1.0", "must be below 1"),
                           ("learner.lora.alpha=0", "learner.lora.alpha=0.0 must be > 0")):
        assert main([recipe, "learner.lora.rank=4", override, f"run.output_dir={tmp_path}", "--check"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("config error: ") and says in lines[0], (override, lines)
    assert main([recipe, "learner.lora.rank=4", f"run.output_dir={tmp_path}", "--check"]) == 0


# --- the DeepSpeed learner with the adapter -------------------------------------------------------------------------

def _learner_state(learner) -> dict:
    return {"trainable": sorted(n for n, p in learner.model.named_parameters() if p.requires_grad),
            "adapter": {n: p.detach().clone() for n, p in learner.model.named_parameters() if is_adapter_parameter(n)}}


@pytest.mark.ray
def test_only_the_adapter_trains_and_the_engines_get_the_merged_weights(ray_cluster, tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    from lopd_ray.actors import build_learners
    from lopd_ray.data.batching import plan_learner_batches
    from lopd_ray.modeling.weights_io import deserialize
    from test_learner_dp import batch

    cfg = load_config(os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml"),
                      [f"model.path={tiny_model_dir}", "learner.num_learners=1", "learner.cpus_per_learner=0.2",
                       "learner.lora.rank=2", "learner.lora.alpha=8", "learner.lora.targets=[q_proj,v_proj]",
                       "learner.lr=0.05", "learner.weight_decay=0.1", "train.prompts_per_step=2",
                       "train.samples_per_prompt=2", "rollout.num_workers=1", "rollout.max_model_len=64"])
    initial = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    learners = build_learners(cfg, tiny_model_dir)
    try:
        before = ray.get(learners[0].__ray_call__.remote(_learner_state))
        plans, norms = plan_learner_batches(batch(), 1, 1, 4096)
        ray.get(learners[0].train_step.remote(plans[0], norms))
        after = ray.get(learners[0].__ray_call__.remote(_learner_state))
        exported = deserialize(ray.get(learners[0].export_weights.remote())["payload"])
        ray.get(learners[0].save_checkpoint.remote(str(tmp_path)))
    finally:
        learners.release()

    layers = {name.rsplit(".", 1)[0] for name in initial if name.endswith(("q_proj.weight", "v_proj.weight"))}
    assert before["trainable"] == sorted(f"{layer}.{ab}.student.weight" for layer in layers
                                         for ab in ("lora_A", "lora_B"))
    # B starts at zero, so the first step moves B (A's gradient is B^T times something: zero).
    assert all(not torch.equal(after["adapter"][n], before["adapter"][n]) for n in after["adapter"] if "lora_B" in n)
    # The engines receive the plain model's tensors: the untouched ones as loaded (weight decay reaches only what the
    # optimizer holds), each adapted one W + alpha / rank * B A with this step's A and B (alpha / rank = 4).
    assert sorted(exported) == sorted({*initial, "lm_head.weight"})
    for name, tensor in exported.items():
        layer = name.removesuffix(".weight")
        if layer in layers:
            a, b = after["adapter"][f"{layer}.lora_A.student.weight"], after["adapter"][f"{layer}.lora_B.student.weight"]
            torch.testing.assert_close(tensor, initial[name] + 4.0 * (b @ a), rtol=0, atol=1e-6)
            assert not torch.equal(tensor, initial[name])
        elif name in initial:
            assert torch.equal(tensor, initial[name]), name

    # A resumed learner starts from the initial weights and takes the adapter back from the checkpoint.
    learners = build_learners(cfg, tiny_model_dir)
    try:
        fresh = deserialize(ray.get(learners[0].export_weights.remote())["payload"])
        ray.get(learners[0].load_checkpoint.remote(str(tmp_path)))
        resumed = deserialize(ray.get(learners[0].export_weights.remote())["payload"])
    finally:
        learners.release()
    assert all(torch.equal(fresh[name], initial[name]) for name in initial)
    assert all(torch.equal(resumed[name], exported[name]) for name in exported)


@pytest.mark.ray
def test_a_run_with_the_adapter_broadcasts_merged_weights_the_engines_score_as_the_learner(ray_cluster, tiny_model_dir,
                                                                                             tmp_path):
    """One step over the broadcast channel (sync.method=collective): the sync probe finds the engine's log-probs
    equal to the learner's, which holds A and B apart; the initial weights in the engine instead are found out."""
    from safetensors.torch import load_file

    from lopd_ray.controller import Controller
    from lopd_ray.modeling.weights_io import serialize
    from lopd_ray.utils.metrics import read_metrics
    from test_training_e2e import PROBE_MAX_MAX, PROBE_MEAN_MAX

    cfg = load_config(os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml"),
                      [f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path}", "run.progress_bar=false",
                       "run.loggers=[]", "run.export_student=false", "run.checkpoint_every_steps=0",
                       "train.total_steps=1", "train.prompts_per_step=4", "rollout.engine=hf", "rollout.num_workers=1",
                       "learner.num_learners=1", "sync.method=collective", "sync.probe_every=1",
                       "learner.lora.rank=4", "learner.lora.alpha=8", "learner.lr=0.05"])
    controller = Controller(cfg)
    try:
        controller.run()
        payload, checksums = serialize(load_file(os.path.join(tiny_model_dir, "model.safetensors")))
        ray.get(controller.workers[0].update_weights.remote(2, {"payload": payload, "checksums": checksums}))
        stale = controller.probe_sync()
    finally:
        controller.shutdown()
    synced = read_metrics(cfg.run_dir)[0]
    assert synced["sync/logprob_diff_mean"] <= PROBE_MEAN_MAX and synced["sync/logprob_diff_max"] <= PROBE_MAX_MAX
    assert stale["sync/logprob_diff_max"] > PROBE_MAX_MAX  # the adapter's step is large enough to be seen
