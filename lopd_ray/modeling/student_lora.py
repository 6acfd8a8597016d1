"""The student's optional LoRA adapter (`learner.lora`): peft's LoRA layers on the named linear layers, the base
weights frozen. What leaves the learner (rollout engines, teachers that follow the student, the export) is the merged
model under its HF names, W + alpha / rank * B A for each adapted layer, so no receiver needs LoRA support; the
DeepSpeed checkpoint holds the adapter with the rest of the module."""
from __future__ import annotations

import sys

import torch

from lopd_ray.errors import ConfigError

ADAPTER_NAME = "student"


def is_adapter_parameter(name: str) -> bool:
    return f".{ADAPTER_NAME}." in name and ".lora_" in name


def add_student_adapter(model: torch.nn.Module, lora_cfg) -> None:
    """Injects the adapter into `model` (an HF causal LM, in place) and leaves only its A and B trainable."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                        target_modules=list(lora_cfg.targets), bias="none")
    inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_parameter(name))


def adapted_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(module name, LoRA layer) of every adapted layer. A process that never imported peft has none, and a run
    without an adapter never imports it."""
    lora = sys.modules.get("peft.tuners.lora")
    if lora is None:
        return []
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, lora.LoraLayer) and ADAPTER_NAME in module.lora_A]


def hf_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The parameters under the names of the model's HF checkpoint: an adapted layer's base weights under the layer's
    own name, the adapter's A and B left out."""
    return {name.replace(".base_layer.", "."): param for name, param in model.named_parameters()
            if not is_adapter_parameter(name)}


def merged_layers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each adapted layer's weight with the adapter merged in, W + scaling * B A (scaling = alpha / rank), computed
    in float32 and kept in W's dtype, under the layer's HF name. Under ZeRO-3, inside `gathered_parameters`."""
    merged = {}
    for name, layer in adapted_layers(model):
        base = layer.base_layer.weight.detach()
        a, b = layer.lora_A[ADAPTER_NAME].weight.detach(), layer.lora_B[ADAPTER_NAME].weight.detach()
        delta = (b.float() @ a.float()) * layer.scaling[ADAPTER_NAME]
        merged[f"{name}.weight"] = (base.float() + delta).to(base.dtype)
    return merged


def check_targets(model_dir: str, lora_cfg) -> None:
    """Every name in `learner.lora.targets` names linear layers of the model (as peft matches them: the module's
    name or its last parts) and not the output head, whose merged copy would part from tied input embeddings.
    Built on the meta device: no weights are read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    head = model.get_output_embeddings()
    linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                     if isinstance(module, torch.nn.Linear) and module is not head})
    for target in lora_cfg.targets:
        modules = [module for name, module in model.named_modules() if name == target or name.endswith(f".{target}")]
        if not modules or any(not isinstance(m, torch.nn.Linear) or m is head for m in modules):
            found = "names no layer" if not modules else "names a layer that is not a hidden linear layer"
            raise ConfigError(f"learner.lora.targets: '{target}' {found} of {model_dir}: choose among its linear "
                              f"layers {linear}")
