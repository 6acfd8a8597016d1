"""What a failed call is named (lopd_ray/faults.py): a full disk however the writer reports it."""
from __future__ import annotations

import errno
import os
import subprocess

import pytest
import torch

from lopd_ray.faults import TORCH_WRITE_FAILED, no_space_left


def test_a_full_disk_is_found_behind_the_errors_that_carry_it(tmp_path):
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/runs/x")
    assert no_space_left(full) is full
    try:
        try:
            raise full
        except OSError as exc:
            raise RuntimeError("the learner's call failed") from exc
    except RuntimeError as wrapped:
        assert no_space_left(wrapped) is full
    assert no_space_left(RuntimeError("CUDA out of memory")) is None
    assert no_space_left(OSError(errno.EACCES, "Permission denied")) is None


def test_torchs_writer_on_a_real_full_disk_is_named_a_full_disk(tmp_path):
    """torch.save onto a 1 MiB tmpfs raises a RuntimeError without an errno; it is read as the full disk it is."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("no tmpfs can be mounted here (not root)")
    try:
        with pytest.raises(RuntimeError) as raised:
            torch.save({"weights": torch.zeros(1 << 20)}, str(disk / "checkpoint.pt"))
        found = no_space_left(raised.value)
        assert found is not None and found.errno == errno.ENOSPC and found.strerror == TORCH_WRITE_FAILED
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], capture_output=True)  # torch may hold the cut file open
