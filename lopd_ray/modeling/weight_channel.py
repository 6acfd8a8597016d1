"""Weights over a torch.distributed group of their own: learner rank 0 (rank 0 of the channel) broadcasts the
student's tensors, packed into buckets of one dtype, to every receiver (rollout engines, teachers that follow the
student). gloo on CPU, nccl on GPU. The group is made from a TCPStore beside whatever default group a process already
belongs to (DeepSpeed's, on learners and teachers), so any process can join one."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Iterator

import torch

# A bucket: the (name, dtype, shape) of the tensors packed one after another into one flat buffer.
Bucket = list[tuple[str, str, tuple[int, ...]]]


@dataclass(frozen=True)
class Channel:
    """Where a channel's members meet. It travels as a plain dict (`as_dict`), which vLLM's RPC passes too."""
    host: str
    port: int
    name: str  # unique per membership: the store's key prefix
    world_size: int
    backend: str  # "gloo" or "nccl"
    timeout_s: float

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def device(self) -> str:
        return "cuda" if self.backend == "nccl" else "cpu"


def join(channel: dict, rank: int):
    """This process's end of the channel as `rank`; returns when every member has joined."""
    import torch.distributed as dist

    ch = Channel(**channel)
    timeout = timedelta(seconds=ch.timeout_s)
    store = dist.PrefixStore(ch.name, dist.TCPStore(ch.host, ch.port, is_master=False, timeout=timeout))
    if ch.backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, ch.world_size)
    return dist.ProcessGroupGloo(store, rank, ch.world_size, timeout)


def plan_buckets(shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]], bucket_bytes: int) -> list[Bucket]:
    """Tensors in their order, a new bucket at each change of dtype or when the next tensor would overflow
    `bucket_bytes` (a tensor larger than that travels alone)."""
    buckets, size = [], 0
    for name, (dtype, shape) in shapes.items():
        nbytes = math.prod(shape) * dtype.itemsize
        dtype_name = str(dtype).removeprefix("torch.")
        if not buckets or buckets[-1][0][1] != dtype_name or size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((name, dtype_name, tuple(shape)))
        size += nbytes
    return buckets


def send(group, named: dict[str, torch.Tensor], buckets: list[Bucket], device: str) -> None:
    for bucket in buckets:
        flat = torch.cat([named[name].detach().reshape(-1).to(device) for name, _, _ in bucket])
        group.broadcast(flat, 0).wait()


def receive(group, buckets: list[Bucket], device: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) as the buckets arrive; the caller must read to the end (the sender waits for every bucket)."""
    for bucket in buckets:
        flat = torch.empty(sum(math.prod(shape) for _, _, shape in bucket), dtype=getattr(torch, bucket[0][1]),
                           device=device)
        group.broadcast(flat, 0).wait()
        offset = 0
        for name, _, shape in bucket:
            size = math.prod(shape)
            yield name, flat[offset:offset + size].view(shape)
            offset += size
