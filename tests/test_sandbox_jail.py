"""The sandbox against an attacker: each test is an attack a candidate program can make, and what must hold after it.

Candidates run in the jail (lopd_ray/envs/code/jail.py): their own mount, PID, IPC and network namespaces."""
from __future__ import annotations

import ctypes
import json
import os
import secrets
import subprocess
import sys
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
    """/tmp, /var/tmp and /dev/shm: the candidate's own, at most the jail's size, and gone with the run (the host's
    are neither filled nor left with anything); SysV shared memory: refused."""
    mark, key = f"lopd_attack_{secrets.token_hex(6)}", 0x10000000 + secrets.randbelow(1 << 27)
    budget = 3 * SandboxLimits().max_tmp_bytes
    try:
        written, made_segment = run_one(SYSV_SHM, "fill", mark, key, budget)
        assert not made_segment  # SysV shared memory is refused (nothing would cap its total but the timeout)
        assert written <= SandboxLimits().max_tmp_bytes, f"{written >> 20} MiB written to temp files"
        assert not _host_segment(key)
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


NEW_USER_NAMESPACE = '''
import ctypes, os, subprocess

FILL = "mount -t tmpfs none /tmp && for i in 1 2 3 4 5 6 7 8 9 10 11 12; do head -c 8388608 /dev/zero > /tmp/$i; done"

def escape(clone_nr):
    """A user and mount namespace of its own, by clone(), by unshare(), and by the unshare tool, with a tmpfs."""
    libc = ctypes.CDLL(None, use_errno=True)
    found = {"spawn": subprocess.run(["/bin/true"]).returncode}  # clone3's fallback: starting programs still works
    pid = libc.syscall(clone_nr, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
    if pid == 0:
        os._exit(0)
    found["clone"] = ctypes.get_errno() if pid < 0 else 0
    if pid > 0:
        os.waitpid(pid, 0)
    tool = subprocess.run(["unshare", "-Urm", "sh", "-c", FILL + "; du -sk /tmp"], capture_output=True, text=True)
    found["tool_written_mib"] = int(tool.stdout.split()[0]) >> 10 if tool.returncode == 0 else 0
    found["unshare"] = 0 if libc.unshare(0x10000000 | 0x00020000) == 0 else ctypes.get_errno()
    found["tmpfs_mib"] = 0
    if found["unshare"] == 0 and libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None) == 0:
        st = os.statvfs("/tmp")
        found["tmpfs_mib"] = (st.f_blocks * st.f_frsize) >> 20
    return found
'''


def test_no_user_namespace_to_mount_a_tmpfs_past_the_limits():
    """In a user namespace of its own the candidate would hold every capability over a new mount namespace: a tmpfs
    of half the host's memory, filled past the jail's 64 MiB. unshare() and clone() with CLONE_NEWUSER (directly
    or through the unshare tool) are refused (EPERM); starting other programs still works."""
    from lopd_ray.envs.code import seccomp

    found = run_one(NEW_USER_NAMESPACE, "escape", seccomp.architecture().clone, timeout_s=30)
    assert found == {"spawn": 0, "clone": 1, "tool_written_mib": 0, "unshare": 1, "tmpfs_mib": 0}, found


MEMORY_AND_KEYS = '''
import ctypes, os

def grab(numbers):
    """memfd_create (then 768 MiB written to it), shmget and add_key/keyctl: each call's errno, 0 where it worked."""
    libc = ctypes.CDLL(None, use_errno=True)
    found = {}
    try:
        fd = os.memfd_create("grab")
        block = b"x" * (1 << 20)
        for _ in range(768):
            os.write(fd, block)
        found["memfd"] = 0
    except OSError as exc:
        found["memfd"] = exc.errno
    found["shmget"] = 0 if libc.shmget(0, 768 << 20, 0o1000 | 0o600) >= 0 else ctypes.get_errno()
    key = libc.syscall(numbers["add_key"], b"user", b"lopd_attack", b"x" * 64, 64, -2)  # the user keyring
    found["add_key"] = 0 if key >= 0 else ctypes.get_errno()
    found["keyctl"] = 0 if libc.syscall(numbers["keyctl"], 0, -2, 0) >= 0 else ctypes.get_errno()  # GET_KEYRING_ID
    return found
'''


def test_memory_outside_the_address_space_cap_and_kernel_keys_are_refused():
    """Anonymous files (memfd) and SysV segments are not counted by RLIMIT_AS, and kernel keys outlive the run (a
    fresh uid per run keeps the per-user quota from biting): each is refused with EPERM before it takes anything."""
    import errno

    from lopd_ray.envs.code import seccomp

    refused = seccomp.architecture().refused  # memfd_create, shmget, add_key, request_key, keyctl
    before = open("/proc/key-users").read() if os.path.exists("/proc/key-users") else ""
    found = run_one(MEMORY_AND_KEYS, "grab", {"add_key": refused[2], "keyctl": refused[4]}, timeout_s=30)
    assert found == {"memfd": errno.EPERM, "shmget": errno.EPERM, "add_key": errno.EPERM,
                     "keyctl": errno.EPERM}, found
    if before:
        assert open("/proc/key-users").read().count("\n") <= before.count("\n")  # no key user left behind


FLOOD = '''
import errno, os

def flood(folder, most):
    made = 0
    try:
        while made < most:
            open("%s/e%d" % (folder, made), "w").close()
            made += 1
    except OSError as exc:
        return [made, errno.errorcode[exc.errno]]
    return [made, None]
'''


def test_a_flood_of_empty_files_stops_at_the_inode_cap():
    """Empty files take no space, only kernel memory (about 1 KB each): /tmp and /dev/shm each hold at most
    max_tmp_files inodes, their own root folder included."""
    for folder in ("/tmp", "/dev/shm"):
        assert run_one(FLOOD, "flood", folder, 50_000, max_tmp_files=300) == [299, "ENOSPC"], folder
    assert run_one(FLOOD, "flood", "/tmp", 50_000) == [SandboxLimits().max_tmp_files - 1, "ENOSPC"]


RESERVE = '''
import mmap, os

def map_until_refused(chunk):
    held = []
    try:
        while len(held) < 512:
            held.append(mmap.mmap(-1, chunk))
    except (OSError, MemoryError):
        pass
    return held


def reserve_everywhere(chunk):
    """Forks as often as allowed, then every process maps address space until refused; returns each one's share."""
    report, done = os.pipe(), os.pipe()
    children = []
    while True:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            held = map_until_refused(chunk)
            os.write(report[1], b"%d\\n" % len(held))
            os.read(done[0], 1)  # keeps its mappings until the harness has counted
            os._exit(0)
        children.append(pid)
    held = map_until_refused(chunk)
    text = b""
    while text.count(b"\\n") < len(children):
        text += os.read(report[0], 4096)
    os.write(done[1], b"x" * len(children))
    for pid in children:
        os.waitpid(pid, 0)
    return [len(held)] + [int(n) for n in text.split()]
'''


def test_the_runs_processes_share_one_memory_cap():
    """Each of the candidate's processes (the harness and the forks RLIMIT_NPROC allows) maps all the address space
    it can: together they stay within memory_bytes, instead of memory_bytes each."""
    chunk, memory = 16 << 20, 1 << 30
    shares = run_one(RESERVE, "reserve_everywhere", chunk, timeout_s=30, memory_bytes=memory, max_processes=4)
    assert len(shares) == 4 and min(shares) > 0, shares  # the harness and 3 forks, each with some memory
    assert sum(shares) * chunk <= memory, f"{sum(shares) * chunk >> 20} MiB mapped by {shares}"


LARGE_RESULT = '''
import json, resource, sys

from lopd_ray.config import EnvConfig
from lopd_ray.envs import data
from lopd_ray.envs.code import CodeChecker, SandboxLimits, build_program, load_problems
from lopd_ray.envs.code.benchmarks import BENCHMARK_FILES
from lopd_ray.envs.code.env import feedback

problems = load_problems(str(data.data_root(EnvConfig()) / BENCHMARK_FILES["humaneval"]), "humaneval")
problem = next(p for p in problems if p.task_id == "HumanEval/0")
checker = CodeChecker(SandboxLimits(timeout_s=60))
checker.expected(problem)
rows, before = [], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for body in sys.argv[1:]:
    verdict = checker.check(problem, build_program(problem, body))
    rows.append([verdict.status, verdict.run.status, feedback(problem, verdict).splitlines()[0]])
print(json.dumps({"rows": rows, "extra_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
'''
# '["tuple",[1]],' is 15 characters: just under 16 MiB of empty-ish tuples, which decode to ~25 times their size.
RETURNED = "    return [(1,)] * ((16 << 20) // 15 - 1000)\n"
FORGED = '''    import os, stat
    line = b'V 0 ["list",[' + b'["tuple",[1]],' * ((16 << 20) // 15 - 1000) + b'["tuple",[1]]]]\\n'
    for fd in range(3, 32):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, line)
        except OSError:
            pass
    return False
'''


def test_a_result_just_under_the_old_16_mib_cap_is_refused_before_the_parent_decodes_it():
    """A 16 MiB result of nested values costs ~400 MB to decode. A candidate's result may be at most 4 times the
    task's longest canonical one, and 1 MiB whatever the task: the harness reports a longer returned value as too
    large, the parent refuses a longer line written on the result channel once it has read that much; either way
    the episode fails saying so, and the parent's memory grows by far less than 100 MB."""
    proc = subprocess.run([sys.executable, "-c", LARGE_RESULT, RETURNED, FORGED], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = json.loads(proc.stdout.splitlines()[-1])
    (returned, returned_run, returned_says), (forged, forged_run, _) = measured["rows"]
    assert (returned, returned_run) == ("unsupported_output", "stopped") and "too large" in returned_says
    assert (forged, forged_run) == ("protocol_error", "protocol_error")
    assert measured["extra_mib"] < 100, measured
