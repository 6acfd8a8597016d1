"""The sandbox against an attacker: each test is an attack a candidate program can make, and what must hold after it.

Candidates run in the jail (lopd_ray/envs/code/jail.py): their own mount, PID, IPC and network namespaces."""
from __future__ import annotations

import ctypes
import os
import secrets
import tempfile
import time
import tracemalloc

import pytest

import lopd_ray
from lopd_ray.envs.code import jail
from lopd_ray.envs.code.sandbox import SandboxLimits, run_program
from lopd_ray.envs.data import locate_data_root

pytestmark = pytest.mark.skipif(bool(jail.unavailable_reason()), reason=jail.unavailable_reason() or "")

PROBE = '''
import os

def probe(paths):
    found = {}
    for path in paths:
        try:
            if os.path.isdir(path):
                found[path] = sorted(os.listdir(path))
            else:
                with open(path, "rb") as f:
                    found[path] = f.read(64).decode("latin-1")
        except OSError as exc:
            found[path] = type(exc).__name__
    return found
'''


def run_one(program: str, entry_point: str, *args, **limits):
    result = run_program(program, entry_point, [args], SandboxLimits(**limits))
    assert result.ok, (result.status, result.message, result.stderr_tail)
    return result.outputs[0].value()


def test_the_answer_key_and_the_host_files_are_out_of_reach(tmp_path):
    """Reading the benchmark's canonical solutions (the data files, the installed packages, the checkout) would
    score every task 1.0: none of them exists inside, whatever the candidate's privileges."""
    key = tmp_path / "answers.json"
    key.write_text('{"HumanEval/0": "return True"}')
    key.chmod(0o600)
    checkout = os.path.dirname(os.path.dirname(lopd_ray.__file__))
    paths = [str(key), str(locate_data_root(None)[0]), checkout, lopd_ray.__file__, os.path.dirname(tempfile.__file__)
             + "/site-packages", "/etc/passwd", "/root/.bash_history", "/proc/1/environ"]
    found = run_one(PROBE, "probe", paths)
    leaked = {p: v for p, v in found.items() if v not in ("FileNotFoundError", "PermissionError", [])}
    assert not leaked, leaked
    # What is left to see: the standard library (the candidate's imports) and its own working directory.
    assert run_one("import os, json\ndef f():\n    return [os.getcwd(), json.dumps([1])]", "f") == ["/tmp", "[1]"]


def test_a_detached_process_tree_dies_with_the_run():
    """A candidate that forks a chain of children, each in a new session and exiting as soon as its child runs,
    races any sweep of the process table; the last one then sleeps. Nothing of it may outlive the run."""
    mark = f"{37 + secrets.randbelow(50)}.{secrets.randbelow(10**9):09d}"
    program = f'''
import os, time

def hop():
    if os.fork():
        return
    os.setsid()
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        try:
            if os.fork():
                os._exit(0)
        except OSError:
            continue
        os.setsid()
    os.execv("/bin/sleep", ["sleep", "{mark}"])

def f():
    hop()
    return 1
'''
    assert run_one(program, "f") == 1
    time.sleep(2.5)  # the chain has stopped hopping by now: the survivor, if any, sleeps
    survivors = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if mark.encode() in f.read():
                    survivors.append(int(pid))
        except OSError:
            pass
    for pid in survivors:
        os.kill(pid, 9)
    assert not survivors


def test_a_forged_oversized_result_line_is_refused_as_it_arrives():
    """The candidate finds the result channel and writes one 48 MiB line on it: the parent stops reading at the
    per-result limit instead of holding (and later parsing) all of it."""
    program = '''
import os, stat

def f():
    line = b"V 0 [" + b"0," * (24 << 20)
    for fd in range(3, 32):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                for i in range(0, len(line), 1 << 20):
                    os.write(fd, line[i:i + (1 << 20)])
        except OSError:
            pass
    return 1
'''
    limit = 4 << 20
    tracemalloc.start()
    try:
        result = run_program(program, "f", [()], SandboxLimits(timeout_s=20, max_result_bytes=limit))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.status == "protocol_error", (result.status, result.message)
    assert peak < 3 * limit, f"the parent held {peak / 2**20:.0f} MiB for a result limit of {limit / 2**20:.0f} MiB"


SYSV_SHM = '''
import ctypes, os

def fill(mark, key, budget):
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            with open(os.path.join(d, mark), "w") as f:
                f.write("left behind")
        except OSError:
            pass
    written = 0
    block = b"x" * (1 << 20)
    try:
        for i in range(budget >> 20):
            with open("/tmp/%s.%d" % (mark, i), "wb") as f:
                f.write(block)
            written += len(block)
    except OSError:
        pass
    libc = ctypes.CDLL(None, use_errno=True)
    segment = libc.shmget(key, 1 << 20, 0o1000 | 0o666)
    return [written, segment >= 0]
'''


def _host_segment(key: int) -> bool:
    with open("/proc/sysvipc/shm") as f:
        return any(int(line.split()[0]) == key for line in list(f)[1:])


def test_temp_files_and_shared_memory_are_private_bounded_and_gone():
    """/tmp, /var/tmp, /dev/shm and SysV shared memory: the candidate's own, at most the jail's size, and gone with
    the run (the host's are neither filled nor left with anything)."""
    mark, key = f"lopd_attack_{secrets.token_hex(6)}", 0x10000000 + secrets.randbelow(1 << 27)
    budget = 3 * SandboxLimits().max_tmp_bytes
    try:
        written, made_segment = run_one(SYSV_SHM, "fill", mark, key, budget)
        assert made_segment  # inside its own IPC namespace the candidate may use shared memory...
        assert written <= SandboxLimits().max_tmp_bytes, f"{written >> 20} MiB written to temp files"
        assert not _host_segment(key)  # ...which is not the host's and dies with the run
        left = [d for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.exists(os.path.join(d, mark))]
        assert not left, left
    finally:
        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            for name in os.listdir(d) if os.path.isdir(d) else ():
                if name.startswith(mark):
                    os.unlink(os.path.join(d, name))
        if _host_segment(key):
            libc = ctypes.CDLL(None)
            libc.shmctl(libc.shmget(key, 0, 0), 0, None)  # IPC_RMID


def test_the_hosts_shared_temp_folders_are_not_writable():
    """A world-writable folder of the host's /tmp (Ray's session folders are one: code left there runs in later
    Ray workers) is not reachable."""
    shared = tempfile.mkdtemp(prefix="lopd_shared_", dir="/tmp")
    os.chmod(shared, 0o777)
    try:
        program = ("def f(d):\n    try:\n        open(d + '/planted.py', 'w').write('x')\n        return 'written'\n"
                   "    except OSError as exc:\n        return type(exc).__name__")
        assert run_one(program, "f", shared) != "written"
        assert os.listdir(shared) == []
    finally:
        for name in os.listdir(shared):
            os.unlink(os.path.join(shared, name))
        os.rmdir(shared)
