"""Weights on the wire: HF-named tensors as safetensors bytes, with a checksum per tensor."""
from __future__ import annotations

import hashlib

import torch


def tensor_checksum(t: torch.Tensor) -> str:
    return hashlib.blake2b(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes(),
                           digest_size=8).hexdigest()


def serialize(named: dict[str, torch.Tensor]) -> tuple[bytes, dict[str, str]]:
    """Clones so that tied tensors (lm_head / embeddings) are written as separate entries."""
    from safetensors.torch import save

    tensors = {name: t.detach().cpu().clone().contiguous() for name, t in named.items()}
    return save(tensors), {name: tensor_checksum(t) for name, t in tensors.items()}


def deserialize(payload: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(payload)


def verify(payload: bytes, checksums: dict[str, str]) -> list[str]:
    """Names whose received bytes differ from what was sent, or that are missing."""
    received = deserialize(payload)
    return sorted(name for name, digest in checksums.items()
                  if name not in received or tensor_checksum(received[name]) != digest)
