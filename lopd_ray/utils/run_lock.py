"""One run per run folder: the training driver holds an exclusive `flock` on `<run folder>/run.lock` for the run's
whole life, with its pid, host and start time written in the file. A second run on the folder is refused in one
line naming the holder. The kernel drops the lock when its holder dies however it dies, so a record left in a file
nobody holds is a dead run's: the next run takes the folder over and says so. A clean end empties the file (it is
never deleted: a run that opened it just before the unlink would hold a lock on a file no one else can see)."""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
from typing import Optional

from lopd_ray.errors import ConfigError

LOCK_FILE = "run.lock"


def _record_of_this_process() -> bytes:
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    return (json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}) + "\n").encode()


def _holder(fd: int) -> Optional[str]:
    """Who the lock file names, in words; None when it is empty."""
    text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        record = json.loads(text)
        return f"process {record['pid']} on host {record['host']} (started {record['started']})"
    except (ValueError, KeyError, TypeError):
        return f"a process that wrote {text[:200]!r}"


def _in_use(run_dir: str, holder: Optional[str]) -> ConfigError:
    return ConfigError(f"the run folder {run_dir} is in use by {holder or 'another process'}, a run still going: "
                       f"wait for it to end or stop it, or give this run another run.name (or run.output_dir)")


class RunFolderLock:
    """The lock of one run folder, held from `acquire` to `release` (or the process's end)."""

    def __init__(self):
        self.fd: Optional[int] = None

    def acquire(self, run_dir: str) -> None:
        """Raises ConfigError while another process holds the folder."""
        os.makedirs(run_dir, exist_ok=True)
        # O_CLOEXEC: the processes Ray starts from the driver never share (and so never keep) the lock.
        fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise _in_use(run_dir, holder) from None
        except OSError as exc:  # a filesystem without locks: run as before, unguarded
            os.close(fd)
            print(f"the run folder {run_dir} cannot be locked ({exc.strerror}): nothing stops a second run with "
                  f"the same run.name from writing into it", file=sys.stderr, flush=True)
            return
        previous = _holder(fd)
        if previous:
            print(f"the run folder {run_dir} was locked by {previous}, which is no longer running: this run takes "
                  f"it over", file=sys.stderr, flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, _record_of_this_process(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing the only descriptor drops the lock
            self.fd = None


def refuse_a_held_run_folder(run_dir: str) -> None:
    """What `acquire` would refuse, without creating the folder or holding anything (for `--check`)."""
    try:
        fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file: no run has held the folder
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(run_dir, _holder(fd)) from None
    except OSError:
        pass
    finally:
        os.close(fd)
