"""Writes that a crash cannot leave half done: a file or a directory is written under a temporary name beside its
destination and renamed into place when complete."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str, data: bytes | str) -> None:
    """`path` holds either its old content or all of `data`, never a part."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def previous_path(directory: str) -> str:
    """Where `atomic_directory` keeps the replaced directory during the swap (a reader may fall back to it)."""
    parent, name = os.path.split(os.path.abspath(directory))
    return os.path.join(parent, f".{name}.previous")


@contextlib.contextmanager
def atomic_directory(directory: str) -> Iterator[str]:
    """Yields an empty temporary directory beside `directory`. When the block completes, it replaces `directory`
    by two renames (the old one waits at `previous_path` in between); when the block raises, it is removed."""
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    backup = previous_path(directory)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    try:
        yield tmp
        fsync_dir(tmp)
        if os.path.isdir(directory):
            shutil.rmtree(backup, ignore_errors=True)
            os.rename(directory, backup)
        os.rename(tmp, directory)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(backup, ignore_errors=True)
