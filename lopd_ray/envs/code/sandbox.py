"""Runs an untrusted Python program in a fresh interpreter process and returns what its entry point returned.

One process per candidate, started without `preexec_fn` (so that `subprocess` can vfork: forking a parent with a
large heap costs ~90 ms at 2 GB RSS, and running Python between fork and exec is unsafe in a threaded parent), in
its own session and process group, with an environment built from scratch and the standard library only. By default
it runs in the jail (jail.py: its own mount, PID, IPC and network namespaces, seeing the interpreter and a private
size-limited /tmp, nothing else of the host; the whole tree dies with the PID namespace). The harness (our code,
given on the command line, its payload on stdin, run before any candidate code) then isolates its own process:
in the jail, it mounts the jail's writable tmpfs (limited in size and inodes); outside the jail, a fresh network
namespace when the kernel allows it; `resource.setrlimit` on address space (the run's budget split over its
processes), CPU seconds, processes (RLIMIT_NPROC), file size, open files and core dumps; when we run as root, a
fresh unused uid (the kernel never applies RLIMIT_NPROC to root), which drops every capability (outside the jail
keeping CAP_DAC_READ_SEARCH when the interpreter is not world-readable, e.g. under /root/.pyenv), else every
capability of its own user namespace dropped; no_new_privs; a seccomp filter against new user namespaces, memfd,
SysV shared memory and kernel keys (seccomp.py). Then it
points fd 1 at /dev/null, replaces `socket` (best effort), runs the candidate, calls the entry point on every input
and writes one line per result on a private copy of stdout, encoded by a strict codec that accepts only exact
builtin types (an object whose `__eq__` is always True is "unsupported"). A per-run random nonce follows the last
result; a run without it failed (`sys.exit(0)`, `os._exit(0)`, a crash). The parent refuses a line longer than the
per-result limit as it arrives, and compares outputs itself, never in the child. It SIGKILLs the PID namespace and
the process group on timeout and after every run, and with a private uid every process of that uid.
See docs/code_benchmarks.md.
"""
from __future__ import annotations

import json
import logging
import marshal
import os
import pwd
import random
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from lopd_ray.envs.code import jail, seccomp

log = logging.getLogger(__name__)

# The codec runs in the child (encode outputs, decode inputs) and in the parent (encode inputs, decode outputs).
# Encoded values are JSON: None/bool/str/small int/finite float as themselves, everything else a tagged list.
_CODEC_SOURCE = r'''
import math as _math
import sys as _sys

try:
    from _json import encode_basestring_ascii as _quote   # C; importing `json` would cost the child ~15 ms
except ImportError:  # pragma: no cover - CPython always has _json
    from json.encoder import encode_basestring_ascii as _quote


class Unsupported(TypeError):
    """A value that is not made only of exact builtin types."""


class TooLarge(ValueError):
    """The encoding would exceed the size budget."""


# Characters the encoding may still use: a running lower bound of the JSON size, so that a huge result is given
# up on early instead of after encoding all of it. The harness sets it per result; the parent leaves it infinite.
budget = [float("inf")]
_INT_LIMIT = 1 << 62


def _charge(chars):
    budget[0] -= chars
    if budget[0] < 0:
        raise TooLarge("too_large")


def _is_stdlib_dict(t):
    """Exact Counter / OrderedDict / defaultdict, compared as dicts (as Python compares Counter == dict)."""
    c = _sys.modules.get("collections")
    return c is not None and t in (c.Counter, c.OrderedDict, c.defaultdict)


def _items(items):
    """JSON text of a sequence's elements; homogeneous str / small int / finite float runs at C speed."""
    types = set(map(type, items))
    if types == {str}:
        _charge(sum(map(len, items)))
        return ",".join(map(_quote, items))
    if types == {int} and -_INT_LIMIT < min(items) and max(items) < _INT_LIMIT:
        return ",".join(map(int.__repr__, items))
    if types == {float} and all(map(_math.isfinite, items)):
        return ",".join(map(float.__repr__, items))
    return ",".join(map(encode, items))


def encode(x):
    """JSON text for `x` if it is made only of exact builtin types, else Unsupported. Never calls a method of `x`
    (exact types only), so an object with a custom __eq__/__repr__ cannot influence what is sent."""
    t = type(x)
    if t is str:
        _charge(len(x))
        return _quote(x)
    if x is None:
        return "null"
    if t is bool:
        return "true" if x else "false"
    if t is int:
        return int.__repr__(x) if -_INT_LIMIT < x < _INT_LIMIT else '["int","%s"]' % hex(x)
    if t is float:
        return float.__repr__(x) if _math.isfinite(x) else '["float","%s"]' % float.__repr__(x)
    if t is list or t is tuple or t is set or t is frozenset:
        _charge(len(x) + 1)
        return '["%s",[%s]]' % (t.__name__, _items(x))
    if t is dict or _is_stdlib_dict(t):
        _charge(len(x) + 1)
        return '["dict",[%s]]' % ",".join(["[%s,%s]" % (encode(k), encode(v)) for k, v in dict.items(x)])
    if t is complex:
        return '["complex",%s,%s]' % (encode(x.real), encode(x.imag))
    if t is bytes:
        _charge(2 * len(x))
        return '["bytes","%s"]' % x.hex()
    raise Unsupported(t.__name__)


def _decode_items(items):
    return items if list not in set(map(type, items)) else [decode(i) for i in items]


# Distinct elements of one set or dict that may share a hash value: a forged result of many values that all hash
# alike (multiples of 2**61 - 1, say) would take the parent time quadratic in their number to build.
_MOST_ALIKE = 32


def _hash_spread(values):
    """`values` (decoded), refused when more than _MOST_ALIKE of them share a hash value."""
    seen = {}
    for value in values:
        key = hash(value)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > _MOST_ALIKE:
            raise ValueError("hash_collisions")
    return values


_DECODERS = {
    "list": lambda v: _decode_items(v[1]),
    "tuple": lambda v: tuple(_decode_items(v[1])),
    "set": lambda v: set(_hash_spread([decode(i) for i in v[1]])),
    "frozenset": lambda v: frozenset(_hash_spread([decode(i) for i in v[1]])),
    "dict": lambda v: dict(zip(_hash_spread([decode(k) for k, _ in v[1]]), [decode(i) for _, i in v[1]])),
    "int": lambda v: int(v[1], 16),
    "float": lambda v: float(v[1]),
    "complex": lambda v: complex(float(decode(v[1])), float(decode(v[2]))),
    "bytes": lambda v: bytes.fromhex(v[1]),
}


def decode(x):
    """The value for parsed JSON produced by `encode` (parent side); ValueError/TypeError/KeyError if malformed."""
    if type(x) is list:
        return _DECODERS[x[0]](x)
    if x is None or type(x) in (bool, int, float, str):
        return x
    raise ValueError("not an encoded value")
'''

_HARNESS_MAIN = r'''

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_PR_SET_KEEPCAPS, _PR_SET_SECCOMP, _PR_SET_NO_NEW_PRIVS = 8, 22, 38
_SECCOMP_MODE_FILTER = 2
_CAP_DAC_READ_SEARCH = 2


def _user_task_count(uid):
    import os
    total = 0
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat("/proc/" + name).st_uid == uid:
                total += len(os.listdir("/proc/%s/task" % name))
        except OSError:
            pass
    return total


def _isolate(cfg):
    """Runs first, with the parent's privileges. Returns whether a network namespace is in place."""
    import ctypes
    import os
    import resource

    libc = ctypes.CDLL(None, use_errno=True)

    def check(ret, what):
        if ret != 0:
            raise OSError(ctypes.get_errno(), what)

    uid = cfg["uid"]
    if cfg["writable"]:  # first: as root it needs the CAP_SYS_ADMIN that the uid switch below drops
        _mount_writable(cfg["writable"], own_user_namespace=uid is None)
    netns = cfg["jailed"]  # the jail made every namespace already
    if cfg["namespaces"] and not netns:
        real_uid, real_gid = os.geteuid(), os.getegid()
        # Root needs no user namespace for a network namespace; anyone else gets one, which also gives
        # RLIMIT_NPROC a count of its own.
        if libc.unshare(_CLONE_NEWNET if uid is not None else _CLONE_NEWUSER | _CLONE_NEWNET) == 0:
            netns = True
            if uid is None:
                for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (real_uid, real_uid)),
                                   ("gid_map", "%d %d 1" % (real_gid, real_gid))):
                    with open("/proc/self/" + name, "w") as f:
                        f.write(text)
    nproc = cfg["max_processes"]
    if uid is None and not netns:  # RLIMIT_NPROC counts every process and thread of this user
        nproc += _user_task_count(os.geteuid())
    for name, soft, hard in cfg["rlimits"] + [["RLIMIT_NPROC", nproc, nproc]]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if uid is not None:
        keep = cfg["read_cap"]
        if keep:
            check(libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0), "prctl(KEEPCAPS)")
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if keep:  # only "read and search any file", so that the stdlib under /root still imports

            class Header(ctypes.Structure):
                _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

            class Data(ctypes.Structure):
                _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                            ("inheritable", ctypes.c_uint32)]

            data = (Data * 2)()
            data[0].effective = data[0].permitted = 1 << _CAP_DAC_READ_SEARCH
            check(libc.capset(ctypes.byref(Header(0x20080522, 0)), data), "capset")
    else:  # every capability a user namespace of ours gave (over its mount namespace: a tmpfs of any size)
        check(libc.capset((ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()), "capset")
    check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    if cfg["seccomp"]:  # lopd_ray/envs/code/seccomp.py, for us and everything we start

        class Program(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

        filter_program = cfg["seccomp"]
        program = Program(len(filter_program) // 8, filter_program)
        check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0), "prctl(SECCOMP)")
    return netns


def _block_network():
    import socket
    import _socket

    def refuse(*args, **kwargs):
        raise PermissionError("network access is disabled in the sandbox")

    class RefusedSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            refuse()

    socket.socket = socket.SocketType = _socket.socket = RefusedSocket
    for name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo", "gethostbyname",
                 "gethostbyname_ex", "gethostbyaddr"):
        setattr(socket, name, refuse)
        if hasattr(_socket, name):
            setattr(_socket, name, refuse)


def _describe(exc):
    try:
        return (type(exc).__name__ + ": " + str(exc))[:2000]
    except BaseException:
        return type(exc).__name__


def _main():
    import marshal
    import os
    import sys

    payload = marshal.load(sys.stdin.buffer)  # from the parent (trusted): marshal keeps tuples, sets, complex
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    netns = _isolate(payload["isolation"])
    nonce = payload["nonce"]
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    out = os.fdopen(os.dup(1), "w", encoding="ascii")
    out.write("S %d\n" % netns)
    out.flush()  # before any candidate code runs, so the first S line is always ours
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")
    inputs = payload["inputs"]
    entry_point = payload["entry_point"]
    _block_network()
    namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
    try:
        exec(compile(payload["program"], "<candidate>", "exec"), namespace)
        fn = namespace.get(entry_point) if entry_point else None
        if entry_point and not callable(fn):
            raise NameError("entry point %r is not defined" % entry_point)
    except BaseException as exc:
        out.write("L " + _quote(_describe(exc)) + "\n")
        out.flush()
        os._exit(3)
    not_none = payload["output_not_none"]
    max_result_chars = payload["max_result_chars"]
    for i, args in enumerate(inputs):
        try:
            value = fn(*args)
        except BaseException as exc:
            line = "E %d %s" % (i, _quote(type(exc).__name__))
        else:
            if not_none and type(value) is not bool:
                value = value is not None
            try:
                budget[0] = max_result_chars
                line = "V %d %s" % (i, encode(value))
                if len(line) > max_result_chars:
                    raise TooLarge("too_large")
            except (Unsupported, TooLarge) as exc:
                line = "U %d %s" % (i, _quote(exc.args[0]))
            except BaseException as exc:
                line = "U %d %s" % (i, _quote(type(exc).__name__))
        out.write(line + "\n")
        out.flush()
    out.write("N " + nonce + "\n")
    out.flush()
    os._exit(0)


_main()
'''

_codec: dict[str, Any] = {}
exec(compile(_CODEC_SOURCE, "<codec>", "exec"), _codec)
Unsupported = _codec["Unsupported"]


def encode_value(value: Any) -> str:
    """JSON text of a value made only of exact builtin types (else `Unsupported`): what the harness sends."""
    return _codec["encode"](value)


def decode_value(text: str) -> Any:
    """The value back from `encode_value`'s text; raises ValueError/TypeError/KeyError/IndexError if malformed."""
    return _codec["decode"](json.loads(text))


@dataclass
class SandboxLimits:
    timeout_s: float = 10.0                  # wall clock for the whole run; RLIMIT_CPU is this plus one second
    memory_bytes: int = 2 << 30              # the whole run's: RLIMIT_AS of memory_bytes / max_processes per process
    max_processes: int = 4                   # RLIMIT_NPROC: the harness plus at most 3 forks/threads
    max_file_bytes: int = 16 << 20           # RLIMIT_FSIZE
    max_open_files: int = 64                 # RLIMIT_NOFILE
    max_result_bytes: int = 16 << 20         # one encoded result; a larger one is reported as "too_large"
    max_output_bytes: int = 512 << 20        # what the parent reads from the result channel at most
    max_tmp_bytes: int = 64 << 20            # each of the jail's private /tmp and /dev/shm
    max_tmp_files: int = 1024                # each of them: files and folders (its tmpfs's nr_inodes)
    # Run in the jail (jail.py: own mount, PID, IPC and network namespaces; needs bubblewrap); False: the process
    # limits alone, where the candidate can read what the host's other users can and leave files in /tmp.
    jail: bool = True


@dataclass(frozen=True)
class Output:
    """One result as it came over the result channel: `kind` "value" (`raw` is the encoded value as JSON text),
    "error" (`raw` is the exception's type name) or "unsupported" (`raw`: the type name, or "too_large")."""

    kind: str
    raw: str

    def value(self) -> Any:
        """The decoded builtin value (for "value"), else the name; raises ValueError/TypeError when malformed."""
        if self.kind != "value":
            return self.raw
        return decode_value(self.raw)


@dataclass
class RunResult:
    """`status`: ok | load_error | timeout | no_nonce | stopped | output_limit | protocol_error."""

    status: str
    outputs: list[Output] = field(default_factory=list)   # kept only when no `on_result` callback consumed them
    num_outputs: int = 0
    message: str = ""
    stderr_tail: str = ""
    wall_s: float = 0.0
    returncode: Optional[int] = None
    pgid: int = 0
    uid: Optional[int] = None
    network_namespace: Optional[bool] = None   # as the harness reported it before the candidate ran

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# --------------------------------------------------------------------------------------------------------------
# Host facts and process bookkeeping (Linux).

def _interpreter_world_readable() -> bool:
    """Whether an unprivileged uid can run this interpreter and read its stdlib (not so under /root/.pyenv)."""
    for target in {os.path.realpath(sys.executable), os.path.realpath(os.path.dirname(os.__file__))}:
        path = target
        while True:
            mode = os.stat(path).st_mode
            need = stat.S_IXOTH | (stat.S_IROTH if path == target else 0)
            if mode & need != need:
                return False
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
    return True


_ROOT = os.geteuid() == 0
_NEEDS_READ_CAP = _ROOT and not _interpreter_world_readable()


class _Isolation:
    """Whether network namespaces work here: assumed until a run reports that it could not create one."""

    def __init__(self):
        self.namespaces = True

    def report(self, run: RunResult, asked: bool) -> None:
        if asked and self.namespaces and run.network_namespace is False:
            self.namespaces = False
            log.warning("sandbox: no network namespace on this host; network is blocked only inside the harness "
                        "(best effort)%s", "" if _ROOT else " and RLIMIT_NPROC counts all of this user's processes")


_ISOLATION = _Isolation()


def isolation() -> dict[str, bool]:
    """What the sandbox enforces here: a network namespace per run (as far as known) and a private uid (root)."""
    return {"network_namespace": _ISOLATION.namespaces, "private_uid": _ROOT}


def _proc_table() -> list[tuple[int, int, str, int]]:
    """(pid, uid, state, pgid) of every process in /proc."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                owner = os.stat(f"/proc/{name}").st_uid
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                found.append((int(name), owner, fields[0].decode(), int(fields[2])))
            except (OSError, IndexError, ValueError):
                pass
    return found


def live_processes(uid: Optional[int] = None, pgid: Optional[int] = None) -> list[int]:
    """Pids of processes that are not zombies and run as `uid` or belong to process group `pgid`. (A killed
    sandbox process whose parent died first stays a zombie, holding nothing but its pid, until init reaps it.)"""
    return [pid for pid, owner, state, group in _proc_table()
            if state != "Z" and ((uid is not None and owner == uid) or (pgid is not None and group == pgid))]


_uid_lock = threading.Lock()
_uids_taken: set[int] = set()
# OS entropy, not the `random` module: rollout workers seed `random` alike, and two processes drawing the same uid
# would kill each other's sandboxes (every process of a run's uid is killed when the run ends).
_uid_rng = random.SystemRandom()


def _allocate_uid() -> int:
    """An unused uid for one run (root only): no passwd entry, no process, inside this namespace's uid map."""
    with open("/proc/self/uid_map") as f:
        ranges = [(int(v[0]), int(v[0]) + int(v[2])) for v in (line.split() for line in f)]
    low, high = max(ranges, key=lambda r: r[1] - r[0])
    low, high = max(low, 1 << 20 if high > 1 << 21 else 40000), min(high, 1 << 30)
    with _uid_lock:
        in_use = {owner for _, owner, _, _ in _proc_table()}
        for _ in range(100):
            uid = _uid_rng.randrange(low, high)
            if uid in _uids_taken or uid in in_use:
                continue
            try:
                pwd.getpwuid(uid)
            except KeyError:
                _uids_taken.add(uid)
                return uid
    raise RuntimeError("sandbox: found no unused uid")


def _release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_taken.discard(uid)


# -s: no user site, -S: no site-packages (the stdlib only), -B: no .pyc, -P: no script dir on sys.path. Not -I,
# which would also ignore PYTHONHASHSEED; the child's environment is built from scratch instead. A fixed seed makes
# set iteration order, hence outputs such as `tuple(set(a) & set(b))`, the same in the canonical and the candidate
# run (EvalPlus gets this by forking its workers from the process that computed the expected outputs).
_PYTHON_FLAGS = ["-s", "-S", "-B"] + (["-P"] if sys.version_info >= (3, 11) else [])
_HARNESS = _CODEC_SOURCE + jail.MOUNT_SOURCE + _HARNESS_MAIN


def _child_env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _isolation_config(limits: SandboxLimits, uid: Optional[int]) -> dict:
    cpu_s = int(limits.timeout_s) + 1
    # Every process of the run may fill its address space: together they stay within memory_bytes.
    per_process = limits.memory_bytes // limits.max_processes
    arch = seccomp.architecture()  # in the jail never None (jail.unavailable_reason)
    return {"namespaces": _ISOLATION.namespaces, "jailed": limits.jail, "uid": uid,
            "read_cap": _NEEDS_READ_CAP and not limits.jail,
            "writable": [(path, limits.max_tmp_bytes, limits.max_tmp_files) for path in jail.WRITABLE]
            if limits.jail else [],
            "seccomp": seccomp.jail_filter(arch) if arch else None,
            "max_processes": limits.max_processes,
            "rlimits": [["RLIMIT_AS", per_process, per_process], ["RLIMIT_CPU", cpu_s, cpu_s + 1],
                        ["RLIMIT_FSIZE", limits.max_file_bytes, limits.max_file_bytes],
                        ["RLIMIT_NOFILE", limits.max_open_files, limits.max_open_files], ["RLIMIT_CORE", 0, 0]]}


def _namespace_init(info_fd: int) -> Optional[int]:
    """The host pid of the jail's PID-namespace init, from bwrap's info JSON; None outside the jail or when bwrap
    failed before making it."""
    if info_fd < 0:
        return None
    os.set_blocking(info_fd, False)
    try:
        return int(json.loads(os.read(info_fd, 4096))["child-pid"])
    except (BlockingIOError, ValueError, KeyError, TypeError):
        return None


def _start_time(pid: int) -> Optional[tuple[str, bytes]]:
    """(state, start time) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), fields[19]
    except (OSError, IndexError):
        return None


def _kill_namespace(init: int, bwrap_pid: int) -> Optional[bytes]:
    """SIGKILLs the jail's init while bwrap (its parent, not reaped yet) still holds it, so the pid is the right
    process; the kernel then kills everything else in the namespace. Returns its start time to wait on."""
    seen = _start_time(init)
    try:
        with open(f"/proc/{init}/status") as f:
            parent = next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
    except (OSError, StopIteration, ValueError):
        return None
    if seen is None or parent != bwrap_pid:
        return None
    try:
        os.kill(init, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return seen[1]


def _kill_everything(proc: subprocess.Popen, uid: Optional[int], namespace_init: Optional[int] = None) -> None:
    """SIGKILL the jail's PID namespace (all of it dies with its init), the run's process group (its leader is not
    reaped yet, so the pgid cannot have been reused), reap the leader, then wait until the namespace's init is dead
    and no live process is left in the group nor, with a private uid, under that uid (which also catches escapes
    from the group via setsid outside the jail), killing again what is left."""
    init_started = _kill_namespace(namespace_init, proc.pid) if namespace_init else None
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for _ in range(500):
        init = _start_time(namespace_init) if init_started else None
        init_alive = init is not None and init[1] == init_started and init[0] != "Z"
        left = live_processes(uid=uid, pgid=proc.pid)
        if not left and not init_alive:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    log.warning("sandbox: processes %s of a finished run are still alive", left)


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


# --------------------------------------------------------------------------------------------------------------
# Running.

def run_program(program: str, entry_point: Optional[str], inputs: list, limits: SandboxLimits, *,
                output_not_none: bool = False,
                on_result: Optional[Callable[[int, Output], bool]] = None) -> RunResult:
    """Runs `program`, then `entry_point(*args)` for each `args` in `inputs` (a list of argument lists/tuples of
    builtin values). `on_result(i, output)` sees each result as it arrives (and then `outputs` stays empty);
    returning False stops the run (status "stopped"). With `entry_point=None` the program only has to run to its end (status "ok").
    `output_not_none`: results are reduced to `value is not None` unless they are bools (EvalPlus's rule for
    MBPP+ tasks that return regex match objects)."""
    if limits.jail and jail.unavailable_reason():
        raise RuntimeError(f"sandbox: {jail.unavailable_reason()}; install bubblewrap or use SandboxLimits(jail=False)")
    nonce = secrets.token_hex(16)
    uid = _allocate_uid() if _ROOT else None
    start = time.monotonic()
    # Outside the jail the candidate's working directory is a private folder of the host's temp dir.
    workdir = None if limits.jail else tempfile.mkdtemp(prefix="lopd_sandbox_")
    info_read, info_write = os.pipe() if limits.jail else (-1, -1)
    try:
        isolation_cfg = _isolation_config(limits, uid)
        payload = marshal.dumps({"nonce": nonce, "program": program, "entry_point": entry_point,
                                 "inputs": [tuple(args) for args in inputs], "isolation": isolation_cfg,
                                 "output_not_none": output_not_none, "max_result_chars": limits.max_result_bytes})
        argv = [jail.interpreter(), *_PYTHON_FLAGS, "-c", _HARNESS]
        if limits.jail:
            argv = jail.command(argv, _ROOT, info_write)
        elif uid is not None:
            os.chown(workdir, uid, uid)
        proc = subprocess.Popen(argv, cwd=workdir, env=_child_env(workdir or jail.INSIDE_WORKDIR),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, pass_fds=(info_write,) if limits.jail else ())
        if limits.jail:
            os.close(info_write)
            info_write = -1
        threading.Thread(target=_feed, args=(proc.stdin, payload), daemon=True).start()
        try:
            result = _collect(proc, nonce, len(inputs), entry_point is None, limits, on_result)
        finally:
            _kill_everything(proc, uid, _namespace_init(info_read))
        result.returncode, result.pgid, result.uid = proc.returncode, proc.pid, uid
        if result.status == "no_nonce" and not result.message:
            result.message = (f"the program ended (exit status {proc.returncode}) after {result.num_outputs} of "
                              f"{len(inputs)} results, without the completion marker")
        result.wall_s = time.monotonic() - start
        _ISOLATION.report(result, isolation_cfg["namespaces"])
        return result
    finally:
        for fd in (info_read, info_write):
            if fd >= 0:
                os.close(fd)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:
            _release_uid(uid)


def _feed(pipe, payload: bytes) -> None:
    """Writes the payload on the child's stdin (a thread: the run's deadline bounds a child that never reads it)."""
    try:
        with pipe:
            pipe.write(payload)
    except (BrokenPipeError, ValueError, OSError):
        pass  # the child died first; the run reports how


def _collect(proc: subprocess.Popen, nonce: str, num_inputs: int, script_only: bool, limits: SandboxLimits,
             on_result: Optional[Callable[[int, Output], bool]]) -> RunResult:
    deadline = time.monotonic() + limits.timeout_s
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    selector.register(proc.stderr, selectors.EVENT_READ)
    pending, pending_bytes, stderr_tail, read_bytes = [], 0, b"", 0
    # The harness never writes a longer line; a forged one is refused as it arrives, never joined or parsed.
    line_limit = limits.max_result_bytes + 64
    result = RunResult(status="no_nonce")
    exited_at = None
    try:
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                result.status = "timeout"
                result.message = f"timed out after {limits.timeout_s:.1f}s"
                return result
            if exited_at is None and _exited(proc.pid):
                exited_at = now
            if exited_at is not None and now - exited_at > 0.5:
                break  # the harness is gone; only descendants still hold the pipes open
            for key, _ in selector.select(timeout=min(0.05, deadline - now)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                if key.fileobj is proc.stderr:
                    stderr_tail = (stderr_tail + chunk)[-8192:]
                    continue
                read_bytes += len(chunk)
                if read_bytes > limits.max_output_bytes:
                    result.status, result.message = "output_limit", "the result channel exceeded its size limit"
                    return result
                if b"\n" not in chunk:
                    pending.append(chunk)  # a long line arrives in many chunks: join once, not per chunk
                    pending_bytes += len(chunk)
                    if pending_bytes > line_limit:
                        return _refuse_long_line(result, line_limit)
                    continue
                *lines, rest = (b"".join(pending) + chunk).split(b"\n")
                pending, pending_bytes = [rest], len(rest)
                if pending_bytes > line_limit or any(len(line) > line_limit for line in lines):
                    return _refuse_long_line(result, line_limit)
                for line in lines:
                    verdict = _parse_line(line, nonce, num_inputs, script_only, result, on_result)
                    if verdict is not None:
                        result.status = verdict
                        return result
        return result
    finally:
        selector.close()
        result.stderr_tail = stderr_tail.decode("utf-8", "replace")


def _refuse_long_line(result: RunResult, line_limit: int) -> RunResult:
    result.status = "protocol_error"
    result.message = f"a line on the result channel is longer than {line_limit} bytes (forged: the harness cuts results)"
    return result


def _parse_line(line: bytes, nonce: str, num_inputs: int, script_only: bool, result: RunResult,
                on_result) -> Optional[str]:
    """Consumes one protocol line; returns a final status or None to read on."""
    kind, _, rest = line.decode("utf-8", "replace").partition(" ")
    if kind == "S" and result.network_namespace is None:  # the harness's report, sent before the candidate ran
        result.network_namespace = rest == "1"
        return None
    if kind == "N":
        if rest != nonce or result.num_outputs != num_inputs:
            result.message = "the completion marker came early or was forged"
            return "protocol_error"
        return "ok"
    if kind == "L":
        try:
            result.message = str(json.loads(rest))
        except ValueError:
            result.message = rest[:2000]
        return "load_error"
    index_text, _, payload = rest.partition(" ")
    if script_only or kind not in ("V", "E", "U") or index_text != str(result.num_outputs):
        result.message = f"unexpected line on the result channel: {line[:200]!r}"
        return "protocol_error"
    if kind == "V":
        output = Output("value", payload)  # decoded only when the exact-text comparison does not settle it
    else:
        try:
            name = json.loads(payload)
        except ValueError:
            name = None
        if type(name) is not str:
            result.message = f"malformed result for input {index_text}"
            return "protocol_error"
        output = Output("error" if kind == "E" else "unsupported", name)
    result.num_outputs += 1
    if on_result is None:
        result.outputs.append(output)
    elif not on_result(result.num_outputs - 1, output):
        return "stopped"
    return None
