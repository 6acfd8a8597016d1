"""What a config check reads of a builtin model that is not built yet: the tokenizer and the context length the
model will have, taken from the files it is built from (the repository's tokenizer assets, SmolLM2's GGUF), so that
`--check` builds nothing."""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Preview:
    tokenizer: Any  # a transformers tokenizer
    max_position_embeddings: Optional[int]


def from_tokenizer_assets(tokenizer_dir: str) -> Preview:
    """A model that tiny.write_random_model writes (then maybe fine-tunes) around the tokenizer of `tokenizer_dir`."""
    from transformers import AutoTokenizer

    from lopd_ray.models.tiny import MAX_POSITIONS

    return Preview(AutoTokenizer.from_pretrained(tokenizer_dir), MAX_POSITIONS)


def from_model_dir(model_dir: str) -> Preview:
    """A model copied from a committed HF directory."""
    from transformers import AutoTokenizer

    with open(os.path.join(model_dir, "config.json")) as f:
        limit = json.load(f).get("max_position_embeddings")
    return Preview(AutoTokenizer.from_pretrained(model_dir), limit)


def from_smollm2_gguf() -> Preview:
    """SmolLM2-135M-Instruct and the students cut from it: the GGUF's tokenizer and context length (its metadata;
    no weights are read)."""
    from transformers import AutoTokenizer

    from lopd_ray.models.gguf_convert import find_smollm2_gguf

    path = find_smollm2_gguf()
    folder, name = os.path.split(path)
    return Preview(AutoTokenizer.from_pretrained(folder, gguf_file=name), gguf_context_length(path))


# GGUF metadata value types (the format's numbering) -> struct format of a scalar; 8 is a string, 9 an array.
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                 12: "<d"}


def gguf_context_length(path: str) -> Optional[int]:
    """`<architecture>.context_length` from a GGUF file's header (version 2 or 3), reading the metadata only up to
    that key: a full parse of the header (the tokenizer's 49k tokens and merges) takes seconds."""
    with open(path, "rb") as f:
        def unpack(fmt: str):
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def skip(value_type: int) -> None:
            if value_type == 8:
                f.seek(unpack("<Q"), 1)
            elif value_type == 9:
                item_type, count = unpack("<I"), unpack("<Q")
                if item_type in _GGUF_SCALARS:
                    f.seek(count * struct.calcsize(_GGUF_SCALARS[item_type]), 1)
                else:
                    for _ in range(count):
                        skip(item_type)
            else:
                f.seek(struct.calcsize(_GGUF_SCALARS[value_type]), 1)

        if f.read(4) != b"GGUF" or unpack("<I") < 2:
            return None
        unpack("<Q")  # tensors
        for _ in range(unpack("<Q")):  # key-value pairs
            key, value_type = f.read(unpack("<Q")).decode(), unpack("<I")
            if key.endswith(".context_length") and value_type in _GGUF_SCALARS:
                return int(unpack(_GGUF_SCALARS[value_type]))
            skip(value_type)
    return None
