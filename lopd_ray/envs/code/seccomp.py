"""The seccomp filter the sandbox's harness installs before any candidate code runs: no new user namespaces, and no
memory or kernel objects outside the jail's caps.

In a user namespace of its own a program holds every capability over the mount namespaces it then creates, so it
could mount a tmpfs of any size and fill it past every limit the sandbox sets. bubblewrap's --disable-userns needs
the jail itself to be a user namespace, which as root it is not (the harness switches to a fresh uid there, and a
user namespace of root maps no other uid); a filter works the same for root, non-root and outside the jail.

unshare() and clone() with CLONE_NEWUSER fail with EPERM; clone3(), whose flags sit behind a pointer a filter cannot
read, fails with ENOSYS, on which the C library falls back to clone(). memfd_create() (anonymous files RLIMIT_AS does
not count), shmget() (SysV shared memory: nothing caps its total but the timeout) and add_key(), request_key() and
keyctl() (kernel keys, which outlive the run: each run's fresh uid keeps the per-user key quota from ever biting)
fail with EPERM. Every other syscall is allowed. A syscall through another ABI of the same machine (i386 or x32
calls on x86_64, arm32 on aarch64) fails with EPERM: the filter reads syscall numbers of the native ABI only."""
from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass
from typing import Optional

CLONE_NEWUSER = 0x10000000


@dataclass(frozen=True)
class Architecture:
    audit_arch: int                 # AUDIT_ARCH_* of the native ABI, as seccomp reports it
    unshare: int
    clone: int
    clone3: int
    foreign_from: Optional[int]     # syscall numbers from here on belong to another ABI (x32 sets bit 30)
    refused: tuple[int, ...]        # memfd_create, shmget, add_key, request_key, keyctl


ARCHITECTURES = {
    "x86_64": Architecture(0xC000003E, unshare=272, clone=56, clone3=435, foreign_from=0x40000000,
                           refused=(319, 29, 248, 249, 250)),
    "aarch64": Architecture(0xC00000B7, unshare=97, clone=220, clone3=435, foreign_from=None,
                            refused=(279, 194, 217, 218, 219)),
}

# Classic BPF as seccomp runs it over struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}.
_LOAD_WORD, _JUMP_EQUAL, _JUMP_AT_LEAST, _JUMP_ANY_BIT, _RETURN = 0x20, 0x15, 0x35, 0x45, 0x06
_NR, _ARCH, _FIRST_ARGUMENT_LOW = 0, 4, 16   # little-endian: the low half of args[0] comes first
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000


def architecture() -> Optional[Architecture]:
    """This machine's entry, None where the filter is not written for it."""
    return ARCHITECTURES.get(platform.machine())


def jail_filter(arch: Architecture) -> bytes:
    """The filter program (struct sock_filter entries) for `arch`."""
    program: list[tuple] = []   # (code, jump-if-true label, jump-if-false label, k)

    def emit(code, k=0, true=None, false=None):
        program.append((code, true, false, k))

    emit(_LOAD_WORD, _ARCH)
    emit(_JUMP_EQUAL, arch.audit_arch, false="foreign")
    emit(_LOAD_WORD, _NR)
    if arch.foreign_from is not None:
        emit(_JUMP_AT_LEAST, arch.foreign_from, true="foreign")
    emit(_JUMP_EQUAL, arch.clone3, true="enosys")
    emit(_JUMP_EQUAL, arch.unshare, true="flags")
    emit(_JUMP_EQUAL, arch.clone, true="flags")
    for number in arch.refused:
        emit(_JUMP_EQUAL, number, true="eperm")
    emit(_RETURN, _ALLOW)
    labels = {"flags": len(program)}
    emit(_LOAD_WORD, _FIRST_ARGUMENT_LOW)
    emit(_JUMP_ANY_BIT, CLONE_NEWUSER, true="eperm")
    emit(_RETURN, _ALLOW)
    labels["eperm"] = labels["foreign"] = len(program)
    emit(_RETURN, _ERRNO | errno.EPERM)
    labels["enosys"] = len(program)
    emit(_RETURN, _ERRNO | errno.ENOSYS)
    # A jump's offset counts from the instruction after it.
    return b"".join(struct.pack("<HBBI", code, labels[true] - i - 1 if true else 0,
                                labels[false] - i - 1 if false else 0, k)
                    for i, (code, true, false, k) in enumerate(program))
