"""The trained student as a plain HF model directory (after training only the student remains: no composer, no
teacher, no bank), loadable by `AutoModelForCausalLM`, vLLM and `python -m lopd_ray.eval --model DIR`."""
from __future__ import annotations

import os
import shutil
import tempfile

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def write_student(payload: bytes, base_model_dir: str, out_dir: str) -> str:
    """`payload`: the learner's safetensors bytes (every parameter, the head under its own name). Config, tokenizer
    and generation files come from the base model; the directory is written under a temporary name and renamed,
    replacing an older export only once the new one is complete."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp_export_")
    for name in os.listdir(base_model_dir):
        source = os.path.join(base_model_dir, name)
        if os.path.isfile(source) and not name.endswith(WEIGHT_SUFFIXES) and not name.endswith(".index.json"):
            shutil.copy2(source, tmp)
    with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(out_dir):
        old = tempfile.mkdtemp(dir=parent, prefix=".old_export_")
        os.rename(out_dir, os.path.join(old, "export"))
        os.rename(tmp, out_dir)
        shutil.rmtree(old)
    else:
        os.rename(tmp, out_dir)
    return out_dir
