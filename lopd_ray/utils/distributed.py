"""One rank of a torch.distributed group inside a Ray actor: where the group meets, and this process's place in it."""
from __future__ import annotations

import os
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def set_rank_env(rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    """The variables torch.distributed and DeepSpeed read; one rank per actor, so the local rank is 0."""
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
