"""The experience bank: successful entries, the embeddings of their documents, top-k cosine retrieval (exact, or
approximate at scale: bank.index)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import time
from collections import Counter
from dataclasses import asdict
from typing import Optional

import numpy as np

from lopd_ray.bank.embedder import Embedder
from lopd_ray.bank.index import INDEXES
from lopd_ray.bank.traces import BankEntry, check_document_mode, document_text
from lopd_ray.config import BankConfig
from lopd_ray.utils.atomic import atomic_directory, previous_path, write_file

SNAPSHOT_FORMAT = 1
ENTRIES_FILE, VECTORS_FILE, MANIFEST_FILE = "entries.jsonl", "vectors.npy", "manifest.json"


class ExperienceBank:
    """Entries and their unit vectors, row i of the index = `entries[i]`. A plain class: wrap it in `ray.remote`."""

    def __init__(self, bank_cfg: BankConfig, embedder: Optional[Embedder] = None):
        self.cfg = bank_cfg
        check_document_mode(bank_cfg.documents)
        self.embedder = embedder or Embedder(bank_cfg)
        self._reset(np.zeros((0, self.embedder.dim), dtype=np.float32), [])
        self._last_retrieve_ms, self._last_hit_rate = 0.0, 0.0

    def _reset(self, vectors: np.ndarray, entries: list[BankEntry]) -> None:
        self.entries: list[BankEntry] = []
        self.vectors = np.zeros((0, self.embedder.dim), dtype=np.float32)
        self._ids: set[str] = set()
        self._per_task: Counter[str] = Counter()
        self._per_task_text: Counter[bytes] = Counter()  # a task text's digest -> how many entries hold it
        self._row_of_text: dict[bytes, int] = {}  # a document's digest -> the first row that embeds it
        self.index = INDEXES[self.cfg.index](self.embedder.dim, self.cfg)
        self._append(vectors, entries)

    def _append(self, vectors: np.ndarray, entries: list[BankEntry]) -> None:
        if entries:
            self.index.add(vectors)
        for row, e in enumerate(entries, start=len(self.entries)):
            self._row_of_text.setdefault(_digest(document_text(e, self.cfg.documents)), row)
        self.vectors = np.concatenate([self.vectors, vectors])
        self.entries += entries
        self._ids.update(e.entry_id for e in entries)
        self._per_task.update(e.task_id for e in entries)
        self._per_task_text.update(_digest(e.task_text) for e in entries)

    def _vectors_of(self, texts: list[str]) -> np.ndarray:
        """Unit vectors of `texts`. A text the bank holds as a document takes that document's vector, so each
        text is encoded once (with bank.documents=task, every later entry and query of a task), and a restored
        bank answers with the very vectors the live one had."""
        keys = [_digest(text) for text in texts]
        missing = list(dict.fromkeys(text for text, key in zip(texts, keys) if key not in self._row_of_text))
        fresh = dict(zip(missing, self.embedder.encode(missing)))
        rows = [self.vectors[self._row_of_text[key]] if key in self._row_of_text else fresh[text]
                for text, key in zip(texts, keys)]
        return np.stack(rows) if rows else np.zeros((0, self.embedder.dim), dtype=np.float32)

    def add(self, entries: list[BankEntry]) -> int:
        """Adds the successful (reward >= bank.success_threshold), not yet present entries; returns how many."""
        new, seen = [], set(self._ids)
        for e in entries:
            if e.reward >= self.cfg.success_threshold and e.entry_id not in seen:
                new.append(e)
                seen.add(e.entry_id)
        self._append(self._vectors_of([document_text(e, self.cfg.documents) for e in new]), new)
        return len(new)

    def retrieve(self, task_texts: list[str], k: int, exclude_task_ids: list[Optional[str]]) -> list[list[BankEntry]]:
        """Top-k entries by cosine for each task text, best first. Unless `bank.self_retrieval`, a query with an
        exclude id drops the entries of that task id and those whose task text is the query's (a split may hold one
        task under several ids); the search asks for that many more, so k still come back when the bank holds k
        others."""
        if len(exclude_task_ids) != len(task_texts):
            raise ValueError(f"{len(task_texts)} task texts but {len(exclude_task_ids)} exclude ids: give one "
                             f"exclude id (or None) per query")
        start = time.perf_counter()
        results: list[list[BankEntry]] = [[] for _ in task_texts]
        if task_texts and k > 0 and self.entries:
            excluded = [None if self.cfg.self_retrieval else x for x in exclude_task_ids]
            extra = max((self._per_task[x] + self._per_task_text[_digest(text)]
                         for x, text in zip(excluded, task_texts) if x is not None), default=0)
            fetch = min(len(self.entries), k + extra)
            unique = list(dict.fromkeys(task_texts))  # a step holds samples_per_prompt copies of each task
            _, rows = self.index.search(self._vectors_of(unique), fetch)
            row_of = dict(zip(unique, rows))
            for result, text, exclude in zip(results, task_texts, excluded):
                hits = (self.entries[i] for i in row_of[text] if i >= 0)
                result += [e for e in hits if exclude is None or (e.task_id != exclude and e.task_text != text)][:k]
        if task_texts:
            self._last_retrieve_ms = (time.perf_counter() - start) * 1000.0 / len(task_texts)
            self._last_hit_rate = sum(bool(r) for r in results) / len(task_texts)
        return results

    def size(self) -> int:
        return len(self.entries)

    def stats(self) -> dict[str, float]:
        """`bank/retrieve_ms` is the per-query mean of the last `retrieve` call (encoding included)."""
        return {"bank/size": float(self.size()), "bank/retrieve_ms": self._last_retrieve_ms,
                "bank/hit_rate": self._last_hit_rate}

    # ---- snapshots --------------------------------------------------------------------------------------------
    def snapshot(self, directory: str) -> None:
        """Writes a complete snapshot into a temp dir beside `directory`, then swaps it in by renames: a crash at
        any point leaves the previous snapshot readable by `restore`."""
        with atomic_directory(directory) as tmp:
            self._write_parts(tmp)

    def _write_parts(self, directory: str) -> None:
        lines = "".join(json.dumps(asdict(e)) + "\n" for e in self.entries)
        write_file(os.path.join(directory, ENTRIES_FILE), lines.encode())
        buffer = io.BytesIO()
        np.save(buffer, self.vectors)
        write_file(os.path.join(directory, VECTORS_FILE), buffer.getvalue())
        manifest = {"format": SNAPSHOT_FORMAT, "size": self.size(), "dim": self.embedder.dim,
                    "embedder_path": self.embedder.path, "documents": self.cfg.documents,
                    "stats": self.stats()}
        write_file(os.path.join(directory, MANIFEST_FILE), json.dumps(manifest, indent=1).encode())

    def restore(self, directory: str) -> None:
        """Replaces the content with a snapshot's; the index is rebuilt from the saved vectors (no re-encoding)."""
        directory = os.path.abspath(directory)
        if not os.path.isfile(os.path.join(directory, MANIFEST_FILE)):
            if not os.path.isfile(os.path.join(previous_path(directory), MANIFEST_FILE)):
                raise FileNotFoundError(f"no bank snapshot at {directory} (no {MANIFEST_FILE}): give a directory "
                                        f"written by ExperienceBank.snapshot")
            directory = previous_path(directory)
        with open(os.path.join(directory, MANIFEST_FILE)) as f:
            manifest = json.load(f)
        if manifest["format"] != SNAPSHOT_FORMAT or manifest["dim"] != self.embedder.dim:
            raise ValueError(f"bank snapshot {directory} has format {manifest['format']}, dim {manifest['dim']}; "
                             f"this bank reads format {SNAPSHOT_FORMAT}, dim {self.embedder.dim}: use the embedder "
                             f"it was built with (bank.embedder_path={manifest['embedder_path']})")
        if manifest["documents"] != self.cfg.documents:
            raise ValueError(f"bank snapshot {directory} embeds documents '{manifest['documents']}' but "
                             f"bank.documents='{self.cfg.documents}': set bank.documents={manifest['documents']}")
        with open(os.path.join(directory, ENTRIES_FILE)) as f:
            entries = [BankEntry(**json.loads(line)) for line in f]
        vectors = np.load(os.path.join(directory, VECTORS_FILE)).astype(np.float32, copy=False)
        if len(entries) != len(vectors) or len(entries) != manifest["size"]:
            raise ValueError(f"bank snapshot {directory} is inconsistent: {len(entries)} entries, {len(vectors)} "
                             f"vectors, manifest size {manifest['size']}")
        self._reset(vectors, entries)
        self._last_retrieve_ms = manifest["stats"]["bank/retrieve_ms"]
        self._last_hit_rate = manifest["stats"]["bank/hit_rate"]


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()
