"""The TrainEngine seam's DeepSpeed implementation: process group, ZeRO engine, parameter gathering."""
from __future__ import annotations

import contextlib
import os
from datetime import timedelta

import torch

from lopd_ray.modeling.logprobs import TokenLogProbModel
from lopd_ray.modeling.student_lora import add_student_adapter
from lopd_ray.utils.lean_imports import import_deepspeed


def init_process_group(wants_gpu: bool, timeout_s: float) -> torch.device:
    """gloo on CPU, nccl on GPU; every collective times out after `timeout_s`."""
    on_gpu = wants_gpu and torch.cuda.is_available()
    # DeepSpeed picks its accelerator once, when first imported; CPU and GPU actors can share a node.
    os.environ["DS_ACCELERATOR"] = "cuda" if on_gpu else "cpu"
    deepspeed = import_deepspeed()

    # The shared-memory all-reduce op costs a 60 s JIT build and gloo does not need it.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo", auto_mpi_discovery=False,
                               timeout=timedelta(seconds=timeout_s))
    if on_gpu:
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def deepspeed_config(grad_clip: float, zero_stage: int = 0, dtype: str = "float32") -> dict:
    """Gradient-accumulation boundaries are set per micro-batch by the caller, so DeepSpeed counts one micro-batch
    per step; the optimizer is a torch one (naming one here would JIT-build a fused op)."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": grad_clip,
        "zero_optimization": {"stage": zero_stage, "overlap_comm": False, "contiguous_gradients": True},
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def load_partitioned(model_path: str):
    """An HF causal LM whose weights are partitioned across this process group (ZeRO-3) and gathered module by
    module for each forward and backward, with no optimizer: (the model, the engine that holds its hooks). Every
    rank must make the same sequence of module calls: nothing is gathered ahead (prefetching follows a recorded
    order) or kept for reuse, so ranks whose passes differ in length stay paired."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    ds_config = deepspeed_config(0.0, 3)
    ds_config["zero_optimization"].update(stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=0,
                                          stage3_param_persistence_threshold=0)
    # While this object lives, from_pretrained loads the weights partitioned (transformers reads it globally).
    hf_ds_config = HfDeepSpeedConfig(ds_config)  # noqa: F841
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    engine, *_ = import_deepspeed().initialize(model=model, config=ds_config)
    return model, engine


def adamw_engine(module: torch.nn.Module, params: list[torch.nn.Parameter], lr: float, ds_config: dict, **adamw):
    """The one way this package steps weights: a DeepSpeed engine over `module` whose optimizer is torch's AdamW on
    `params` (a subset of the module's). Its backward averages the gradients over the process group at each
    accumulation boundary (every rank must call it there); its step clips their global norm as `ds_config` says."""
    optimizer = torch.optim.AdamW(params, lr=lr, **adamw)
    engine, *_ = import_deepspeed().initialize(model=module, optimizer=optimizer, config=ds_config)
    return engine


def build_train_engine(cfg, model_path: str, device: torch.device):
    """Returns (DeepSpeed engine over a TokenLogProbModel, the HF model inside it, pad token id)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    le = cfg.learner
    ds_config = deepspeed_config(le.grad_clip, le.zero_stage, cfg.model.dtype)
    # While this object lives, from_pretrained loads ZeRO-3 models partitioned (transformers reads it globally).
    hf_ds_config = HfDeepSpeedConfig(ds_config) if le.zero_stage == 3 else None  # noqa: F841
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.to(device)
    if le.lora.rank:
        add_student_adapter(model, le.lora)
    engine = adamw_engine(TokenLogProbModel(model), [p for p in model.parameters() if p.requires_grad], le.lr,
                          ds_config, betas=(le.adam_beta1, le.adam_beta2), eps=le.adam_eps,
                          weight_decay=le.weight_decay)
    hf_cfg = AutoConfig.from_pretrained(model_path)
    pad_id = hf_cfg.pad_token_id if hf_cfg.pad_token_id is not None else 0
    return engine, engine.module.lm, pad_id


def gathered_parameters(model, zero_stage: int):
    """Full parameters on every rank for the duration of the block (a no-op below ZeRO-3)."""
    if zero_stage != 3:
        return contextlib.nullcontext()
    return import_deepspeed().zero.GatheredParameters(list(model.parameters()), modifier_rank=None)


def gradient_norm(params) -> float:
    """The norm of the gradients on `params` (ZeRO stage 0: after the backward at an accumulation boundary they are
    reduced over the ranks already)."""
    grads = [p.grad.detach().float().norm() ** 2 for p in params if p.grad is not None]
    return float(torch.stack(grads).sum().sqrt()) if grads else 0.0


def optimizer_step(engine) -> float:
    """Steps the optimizer and returns the global gradient norm before clipping. DeepSpeed records the norm
    for ZeRO stages >= 1 only; for stage 0 the reduced gradients are still on the parameters before the step."""
    norm = None if engine.zero_optimization() else gradient_norm(engine.module.parameters())
    engine.step()
    return norm if norm is not None else float(engine.get_global_grad_norm() or 0.0)
