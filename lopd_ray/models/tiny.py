"""Tiny random causal LMs (Qwen3- or Llama-style) with the repo's tokenizer, built offline for tests and the demo.

`python -m lopd_ray.models.tiny --arch qwen3 --out DIR` writes a normal HF directory that HF and vLLM load.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from lopd_ray.models.tiny_tokenizer import ASSET_DIR

ARCH_SIZES = {
    # head_dim >= 32 keeps vLLM's CPU attention kernels happy.
    "qwen3": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32),
    "llama": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32),
}


def _config(arch: str, vocab_size: int, eos_id: int, pad_id: int):
    from transformers import LlamaConfig, Qwen3Config

    cls = {"qwen3": Qwen3Config, "llama": LlamaConfig}[arch]
    return cls(vocab_size=vocab_size, max_position_embeddings=4096, tie_word_embeddings=True,
               eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None, rope_theta=10000.0,
               **ARCH_SIZES[arch])


def build_tiny_model(out_dir: str, arch: str = "qwen3", seed: int = 0) -> str:
    """Writes the model atomically (a temp dir renamed into place) and returns `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if arch not in ARCH_SIZES:
        raise ValueError(f"unknown tiny arch '{arch}': choose one of {sorted(ARCH_SIZES)}")
    tokenizer = AutoTokenizer.from_pretrained(ASSET_DIR)
    cfg = _config(arch, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp_model_")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(tmp)
    if os.path.exists(out_dir):
        shutil.rmtree(tmp)  # another process built it meanwhile
    else:
        os.rename(tmp, out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--arch", default="qwen3", choices=sorted(ARCH_SIZES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_tiny_model(args.out, args.arch, args.seed))


if __name__ == "__main__":
    main()
