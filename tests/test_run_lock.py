"""One run per run folder: a second run on a folder a live run holds is one `config error:` line naming the folder
and the holder, before Ray starts; the lock of a run that was killed is taken over with one line saying so."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lopd_ray.errors import ConfigError
from lopd_ray.utils.run_lock import LOCK_FILE, RunFolderLock

REPO = Path(__file__).resolve().parent.parent


def train(*args: str) -> subprocess.CompletedProcess:
    # Nothing answers at this address: a run that got past the folder check would fail on it instead.
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS="127.0.0.1:9")
    return subprocess.run([sys.executable, "-m", "lopd_ray.train", "recipes/grpo_letters_cpu.yaml", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_second_run_on_a_held_folder_is_refused_in_one_line_before_ray_starts(tmp_path):
    run_dir = tmp_path / "x"
    held = RunFolderLock()
    held.acquire(str(run_dir))  # this process is the run that holds the folder
    try:
        for extra in ([], ["--check"]):
            proc = train("run.name=x", f"run.output_dir={tmp_path}", *extra)
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            assert proc.returncode == 2 and len(lines) == 1, (extra, proc.returncode, proc.stderr[-2000:])
            assert lines[0].startswith(f"config error: the run folder {run_dir} is in use by process {os.getpid()} "
                                       f"on host {socket.gethostname()} (started "), lines[0]
            assert "run.name" in lines[0] and proc.stdout == ""
        assert sorted(os.listdir(run_dir)) == sorted([LOCK_FILE, "logs"])  # nothing of the refused run but its log
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        held.release()


HOLD = ("import sys, time\nfrom lopd_ray.utils.run_lock import RunFolderLock\nRunFolderLock().acquire(sys.argv[1])\n"
        "print('held', flush=True)\ntime.sleep(120)\n")


def test_the_lock_of_a_killed_run_is_taken_over_with_one_line_and_a_clean_end_leaves_none(tmp_path, capfd):
    run_dir = str(tmp_path / "x")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, run_dir], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(ConfigError, match=rf"^the run folder {run_dir} is in use by process {holder.pid} "):
            RunFolderLock().acquire(run_dir)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    capfd.readouterr()
    lock = RunFolderLock()
    lock.acquire(run_dir)
    said = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith(f"the run folder {run_dir} was locked by process {holder.pid} "), said
    assert said[0].endswith("which is no longer running: this run takes it over")
    assert json.loads(open(os.path.join(run_dir, LOCK_FILE)).read())["pid"] == os.getpid()
    lock.release()
    assert open(os.path.join(run_dir, LOCK_FILE)).read() == ""
    again = RunFolderLock()
    again.acquire(run_dir)  # a folder whose run ended cleanly: taken without a word
    again.release()
    assert capfd.readouterr().err == ""
