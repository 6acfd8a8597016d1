"""The host as a sandboxed program sees it: bubblewrap (`bwrap`, Debian's `bubblewrap` package) gives each run its
own mount, PID, IPC, network, UTS and cgroup namespaces.

Inside, the root is an empty read-only tmpfs holding only what an interpreter of the standard library needs: /usr and
the /bin, /lib... links into it, the interpreter's prefix (with every site-packages folder masked by an empty one, so
installed packages and their data are not readable), /etc/ld.so.cache, a fresh /proc of the run's own PID namespace,
a minimal /dev, and two private tmpfs limited in size and in files: /tmp (the working directory) and /dev/shm, which
the sandbox's harness mounts (bubblewrap sets a tmpfs's size but not its inode count, and an empty file costs kernel
memory but no size; as root with CAP_SYS_ADMIN that bubblewrap leaves it until it switches uid, as non-root in a
user and mount namespace of its own, since bubblewrap's is not one it may mount in). Nothing of the checkout,
the benchmark data, /tmp of the host (Ray's session folders) or other users' files is mounted. When the run's first
process (the namespace's init) dies, the kernel kills every process left in the namespace, however they detached;
SysV IPC objects die with the IPC namespace; the tmpfs with the mount namespace.

bubblewrap over a hand-written unshare + pivot_root: it is a small, audited setuid-free tool packaged by every
distribution, it does the mount setup (including the read-only remount of the new root) in the right order, and
--die-with-parent ties the namespace's life to ours. When we run as root it creates the namespaces without a user
namespace, so the harness can still switch to a private uid (RLIMIT_NPROC is never applied to root's processes).
"""
from __future__ import annotations

import functools
import glob
import os
import platform
import shutil
import subprocess
import sys
import sysconfig

from lopd_ray.envs.code import seccomp

BWRAP = "bwrap"
INSIDE_WORKDIR = "/tmp"
WRITABLE = (INSIDE_WORKDIR, "/dev/shm")   # the harness mounts a tmpfs on each, the first is the working directory
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def interpreter() -> str:
    """The real interpreter (not a virtual environment's link to it): with -S it needs only the standard library."""
    return os.path.realpath(sys.executable)


def _visible_trees() -> list[str]:
    trees = ["/usr"]
    for path in (sys.base_prefix, os.path.dirname(os.path.dirname(interpreter()))):
        path = os.path.realpath(path)
        if not any(path == t or path.startswith(t + os.sep) for t in trees):
            trees.append(path)
    return trees


def _package_folders(trees: list[str]) -> list[str]:
    """Every site-packages / dist-packages folder under the mounted trees (installed packages, this one included
    when installed without -e, and the data they ship)."""
    candidates = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    for tree in trees:
        for pattern in ("lib*/python3*/site-packages", "lib*/python3*/dist-packages", "lib*/python3/dist-packages",
                        "local/lib*/python3*/site-packages", "local/lib*/python3*/dist-packages"):
            candidates.update(glob.glob(os.path.join(tree, pattern)))
    return sorted(p for p in map(os.path.realpath, candidates)
                  if os.path.isdir(p) and any(p.startswith(t + os.sep) for t in trees))


def _ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b']."""
    parts = path.strip(os.sep).split(os.sep)[:-1]
    return [os.sep + os.sep.join(parts[:i + 1]) for i in range(len(parts))]


@functools.lru_cache(maxsize=1)
def _host_view() -> tuple[str, ...]:
    """bwrap's arguments that mount what the jail shows of the host (the same for every run of this process)."""
    trees = _visible_trees()
    args, made = [], set()
    for tree in trees:
        for parent in _ancestors(tree):  # bwrap would make them 0700: the private uid could not reach the tree
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", tree, tree]
    for link in _ROOT_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for folder in _package_folders(trees):
        args += ["--tmpfs", folder, "--remount-ro", folder]
    return tuple(args)


def command(argv: list[str], as_root: bool, info_fd: int) -> list[str]:
    """bwrap's command line that runs `argv` inside the jail; the harness mounts the WRITABLE folders and makes the
    first its working directory."""
    args = [BWRAP, "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
    if as_root:  # the harness mounts the WRITABLE tmpfs, then switches to its private uid, which drops all three
        args += ["--cap-drop", "ALL", *(arg for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SYS_ADMIN")
                                        for arg in ("--cap-add", cap))]
    args += [*_host_view(), "--proc", "/proc", "--dev", "/dev", "--dir", INSIDE_WORKDIR,
             "--remount-ro", "/", "--chdir", "/", "--"]
    return args + argv


# Run by the harness before its other isolation steps (and by the probe below): Python's standard library only.
MOUNT_SOURCE = r'''
def _mount_writable(mounts, own_user_namespace):
    """A tmpfs of `size` bytes and `inodes` files and folders on each (path, size, inodes) of `mounts`; the first
    becomes the working directory. `own_user_namespace` (not root): in a user and mount namespace of our own (the
    caller drops the capabilities it holds there)."""
    import ctypes
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    if own_user_namespace:
        uid, gid = os.geteuid(), os.getegid()
        if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
            raise OSError(ctypes.get_errno(), "unshare(user, mount)")
        for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)),
                           ("gid_map", "%d %d 1" % (gid, gid))):
            with open("/proc/self/" + name, "w") as f:
                f.write(text)
    for path, size, inodes in mounts:
        options = ("size=%d,nr_inodes=%d,mode=1777" % (size, inodes)).encode()
        if libc.mount(b"tmpfs", path.encode(), b"tmpfs", 2 | 4, options) != 0:  # MS_NOSUID | MS_NODEV
            raise OSError(ctypes.get_errno(), "mount(tmpfs) on " + path)
    os.chdir(mounts[0][0])
'''


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str:
    """Empty when a jailed interpreter starts here; else why not (the fix is in the caller's message)."""
    if shutil.which(BWRAP) is None:
        return "bwrap (Debian/Ubuntu package bubblewrap) is not installed"
    if seccomp.architecture() is None:
        return f"the sandbox's seccomp filter is not written for this machine ({platform.machine()})"
    read, write = os.pipe()
    as_root = os.geteuid() == 0
    mount = f"{MOUNT_SOURCE}\n_mount_writable({[(path, 1 << 20, 16) for path in WRITABLE]!r}, {not as_root})"
    try:
        probe = command([interpreter(), "-S", "-c", mount], as_root, write)
        proc = subprocess.run(probe, pass_fds=(write,), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed to start: {exc}"
    finally:
        os.close(read)
        os.close(write)
    if proc.returncode != 0:
        return f"bwrap cannot create namespaces or mount the jail's tmpfs here: {proc.stderr.strip()[-300:]}"
    return ""
