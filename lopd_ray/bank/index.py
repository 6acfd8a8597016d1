"""The bank's vector indexes (`bank.index`): inner product on unit vectors, i.e. cosine, each built empty and grown
by `add` as entries come."""
from __future__ import annotations

# Graph degree of the HNSW index: 32 links per vector is faiss's usual choice for 100k-10M vectors.
HNSW_LINKS = 32


def flat_ip_index(dim: int, bank_cfg):
    """Exact search; a GPU index only when this faiss build sees GPUs."""
    import faiss

    index = faiss.IndexFlatIP(dim)
    if faiss.get_num_gpus() > 0:
        resources = faiss.StandardGpuResources()
        index = faiss.index_cpu_to_gpu(resources, 0, index)
        index.referenced_objects = [resources]  # the GPU index must not outlive its resources
    return index


def hnsw_ip_index(dim: int, bank_cfg):
    """Approximate search over a navigable small-world graph: sublinear in the bank's size, no training, so it
    grows entry by entry like the exact one; `bank.hnsw_ef_search` trades recall for time."""
    import faiss

    index = faiss.IndexHNSWFlat(dim, HNSW_LINKS, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efSearch = bank_cfg.hnsw_ef_search
    index.hnsw.efConstruction = bank_cfg.hnsw_ef_construction
    return index


INDEXES = {"flat": flat_ip_index, "hnsw": hnsw_ip_index}
