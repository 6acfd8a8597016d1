"""The trained student as a plain HF model directory (after training only the student remains: no composer, no
teacher, no bank), loadable by `AutoModelForCausalLM`, vLLM and `python -m lopd_ray.eval --model DIR`."""
from __future__ import annotations

import os
import shutil

from lopd_ray.utils.atomic import atomic_directory, write_file

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def write_student(payload: bytes, base_model_dir: str, out_dir: str) -> str:
    """`payload`: the learner's safetensors bytes (every parameter, the head under its own name). Config, tokenizer
    and generation files come from the base model; an older export is replaced only once the new one is complete."""
    with atomic_directory(out_dir) as tmp:
        for name in os.listdir(base_model_dir):
            source = os.path.join(base_model_dir, name)
            if os.path.isfile(source) and not name.endswith(WEIGHT_SUFFIXES) and not name.endswith(".index.json"):
                shutil.copy2(source, tmp)
        write_file(os.path.join(tmp, "model.safetensors"), payload)
    return out_dir
