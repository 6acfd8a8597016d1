"""Tiny random causal LMs (Qwen3- or Llama-style) with the repo's tokenizer, built offline for tests and the demo.

`build_tiny_model(DIR, arch="qwen3")` (or `python -m lopd_ray.build_model model.path=builtin:tiny-qwen3`) writes a
normal HF directory that HF and vLLM load.
"""
from __future__ import annotations

from lopd_ray.models.tiny_tokenizer import ASSET_DIR
from lopd_ray.utils.atomic import atomic_directory

ARCH_SIZES = {
    # head_dim >= 32 keeps vLLM's CPU attention kernels happy.
    "qwen3": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32),
    "llama": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32),
}
# The context of every model written by write_random_model (the tiny models and those warm-started from them).
MAX_POSITIONS = 4096


def _config(arch: str, vocab_size: int, eos_id: int, pad_id: int, sizes: dict):
    from transformers import LlamaConfig, Qwen3Config

    cls = {"qwen3": Qwen3Config, "llama": LlamaConfig}[arch]
    return cls(vocab_size=vocab_size, max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
               eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None, rope_theta=10000.0,
               **sizes)


def build_tiny_model(out_dir: str, arch: str = "qwen3", seed: int = 0) -> str:
    """Writes the model atomically (a temp dir renamed into place) and returns `out_dir`."""
    if arch not in ARCH_SIZES:
        raise ValueError(f"unknown tiny arch '{arch}': choose one of {sorted(ARCH_SIZES)}")
    return write_random_model(out_dir, arch, ARCH_SIZES[arch], ASSET_DIR, seed)


def write_random_model(out_dir: str, arch: str, sizes: dict, tokenizer_dir: str, seed: int) -> str:
    """A randomly initialized `arch` model of `sizes` with the tokenizer of `tokenizer_dir`, written atomically."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = _config(arch, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, sizes)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(tmp)
    return out_dir


def fingerprint_constants() -> dict:
    """What the builtin models' fingerprints take from this module."""
    return {"ARCH_SIZES": ARCH_SIZES}
