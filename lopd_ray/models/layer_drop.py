"""A smaller student with SmolLM2's vocabulary: SmolLM2-135M-Instruct keeping every `keep_every`-th decoder layer
(the embeddings, final norm and head unchanged), the starting point of on-policy distillation from the full model."""
from __future__ import annotations


def drop_layers(source_dir: str, out_dir: str, keep_every: int) -> str:
    """Writes the layer-dropped copy of the HF model at `source_dir` atomically; returns `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lopd_ray.utils.atomic import atomic_directory

    model = AutoModelForCausalLM.from_pretrained(source_dir, dtype=torch.float32)
    kept = list(model.model.layers)[::keep_every]
    for index, layer in enumerate(kept):
        layer.self_attn.layer_idx = index  # the KV cache is indexed by position in the stack
    model.model.layers = torch.nn.ModuleList(kept)
    model.config.num_hidden_layers = len(kept)
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[::keep_every]
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(source_dir).save_pretrained(tmp)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
    return out_dir


def build_smollm2_student(out_dir: str, keep_every: int = 4) -> str:
    from lopd_ray.models import resolve_model_path

    return drop_layers(resolve_model_path("builtin:smollm2-135m-instruct"), out_dir, keep_every)
