"""Retrieval latency of the bank's indexes (`bank.index`) from 10k to 1M entries, and the approximate index's recall.

    python benchmarks/bank_scale.py [--sizes 10000,100000,1000000] [--ef 64,128,256,512] [--ef-construction 40]
                                    [--queries 1000] [--out F]

The vectors are 384-dimensional (all-MiniLM-L6-v2's width) unit vectors drawn around random cluster centres, as
embeddings of related tasks are; the queries come from the same mixture. Each index is the bank's own
(lopd_ray/bank/index.py, BankConfig defaults), searched one query at a time for the top 3 (bank.top_j) in this
process's threads (one, as in the bank actor); the approximate one with each candidate-list length of `--ef`
(bank.hnsw_ef_search) on one build. Recall@3: the share of the exact index's top 3 that the approximate index also
returns. Encoding a query with the embedder (a few ms on CPU) comes on top and does not depend on size.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import results_file

from lopd_ray.bank.index import INDEXES
from lopd_ray.config import BankConfig

DIM, TOP = 384, 3


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def mixture(n: int, centres: np.ndarray, rng: np.random.Generator, spread: float = 0.6) -> np.ndarray:
    """Unit vectors around `centres` (cosine about 0.86 to their centre)."""
    noise = rng.standard_normal((n, DIM), dtype=np.float32) / np.sqrt(DIM)
    return unit(centres[rng.integers(0, len(centres), n)] + spread * noise)


def measure(index, queries: np.ndarray) -> tuple[np.ndarray, list[float]]:
    rows, seconds = [], []
    for q in queries:
        start = time.perf_counter()
        _, found = index.search(q[None], TOP)
        seconds.append(time.perf_counter() - start)
        rows.append(found[0])
    return np.array(rows), seconds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--ef", default="64,128,256,512")
    parser.add_argument("--ef-construction", type=int, default=BankConfig().hnsw_ef_construction,
                        help="bank.hnsw_ef_construction of the approximate index")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--out", default="benchmarks/results/bank_scale.json")
    args = parser.parse_args(argv)
    cfg = BankConfig(hnsw_ef_construction=args.ef_construction)
    rng = np.random.default_rng(0)
    results = {"dim": DIM, "top": TOP, "ef_construction": args.ef_construction, "sizes": {}}
    for size in map(int, args.sizes.split(",")):
        centres = unit(rng.standard_normal((max(16, size // 100), DIM), dtype=np.float32))  # 100 entries each
        vectors, queries = mixture(size, centres, rng), mixture(args.queries, centres, rng)
        row, exact = {}, None
        for name in ("flat", "hnsw"):
            index = INDEXES[name](DIM, cfg)
            start = time.perf_counter()
            for chunk in range(0, size, 50_000):
                index.add(vectors[chunk:chunk + 50_000])
            build_s = time.perf_counter() - start
            for ef in map(int, args.ef.split(",")) if name == "hnsw" else [None]:
                label = name if ef is None else f"hnsw_ef{ef}"
                if ef is not None:
                    index.hnsw.efSearch = ef
                found, seconds = measure(index, queries)
                ms = np.array(seconds) * 1000
                row[label] = {"build_s": build_s, "p50_ms": float(np.percentile(ms, 50)),
                              "p99_ms": float(np.percentile(ms, 99))}
                if exact is None:
                    exact = found
                else:
                    hits = [len(set(a) & set(b)) for a, b in zip(found, exact)]
                    row[label]["recall_at_3"] = sum(hits) / (TOP * len(hits))
                print(f"{size:>8d} {label:11s} build {build_s:6.1f}s  p50 {row[label]['p50_ms']:.3f} ms  "
                      f"p99 {row[label]['p99_ms']:.3f} ms" + (f"  recall@3 {row[label]['recall_at_3']:.3f}"
                                                              if "recall_at_3" in row[label] else ""), flush=True)
            del index
        results["sizes"][str(size)] = row
    results_file.write(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
