"""The broadcast channel of sync.method=collective: buckets planned by dtype and size, and every tensor arriving
bit-exact at every receiver (three members in threads of this process, over gloo)."""
from __future__ import annotations

import threading

import torch

from lopd_ray.modeling.weight_channel import Channel, join, plan_buckets, receive, send


def test_buckets_split_at_a_dtype_change_and_at_the_size_limit():
    shapes = {"a": (torch.float32, (4, 4)), "b": (torch.float32, (8,)), "c": (torch.float32, (30,)),
              "d": (torch.bfloat16, (2,)), "e": (torch.float32, (2,))}
    buckets = plan_buckets(shapes, bucket_bytes=100)
    assert [[name for name, _, _ in bucket] for bucket in buckets] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert buckets[0] == [("a", "float32", (4, 4)), ("b", "float32", (8,))]
    assert buckets[2] == [("d", "bfloat16", (2,))]


def test_every_receiver_gets_every_tensor_bit_exact():
    import torch.distributed as dist

    generator = torch.Generator().manual_seed(0)
    named = {"embed.weight": torch.randn(50, 8, generator=generator),
             "norm.weight": torch.randn(8, generator=generator).to(torch.bfloat16),
             "layer.weight": torch.randn(8, 8, generator=generator),
             "lm_head.weight": torch.randn(50, 8, generator=generator)}
    buckets = plan_buckets({n: (t.dtype, tuple(t.shape)) for n, t in named.items()}, bucket_bytes=1024)
    assert len(buckets) == 4  # the embedding alone overflows a bucket; the bf16 norm splits the rest
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    channel = Channel("127.0.0.1", store.port, "test", 3, "gloo", 30.0).as_dict()
    received, errors = {}, []

    def member(rank: int) -> None:
        try:
            group = join(channel, rank)
            if rank == 0:
                send(group, named, buckets, "cpu")
            else:
                received[rank] = {name: t.clone() for name, t in receive(group, buckets, "cpu")}
        except Exception as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    for rank in (1, 2):
        assert list(received[rank]) == list(named)
        for name, tensor in named.items():
            assert received[rank][name].dtype == tensor.dtype and torch.equal(received[rank][name], tensor), name
