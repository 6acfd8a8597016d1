"""A run kept on remote storage. When `run.output_dir` is a URI (s3://, gs://, hdfs://, file://: any filesystem fsspec
reaches with its plug-in installed), the run works in a local staging directory (`run.staging_dir`) and copies what it
writes up to <uri>/<run.name>: each complete checkpoint, then the pointer to it (so the remote `latest` never names a
partial one), the checkpoints pruned locally removed there too, and every other file (metrics, evaluations, rollouts,
logs, the exported student). A resume that finds nothing staged fetches the run down first."""
from __future__ import annotations

import os

from lopd_ray.utils.run_lock import LOCK_FILE

CHECKPOINTS = "checkpoints"


def is_uri(path: str) -> bool:
    return "://" in path


class RunStorage:
    def __init__(self, uri: str, local_dir: str):
        import fsspec

        self.uri, self.local = uri, local_dir
        self.fs, self.root = fsspec.core.url_to_fs(uri)
        self.sent: dict[str, tuple[int, int]] = {}  # file -> (size, mtime) when it went up

    def _remote(self, relative: str) -> str:
        return f"{self.root.rstrip('/')}/{relative}"

    def _put(self, relative: str) -> None:
        """One file, or every file under a directory, of the staging directory; a file unchanged since it went up
        (the rollouts and logs of earlier steps) is not sent again."""
        path = os.path.join(self.local, relative)
        files = ([path] if os.path.isfile(path) else
                 [os.path.join(root, name) for root, _, names in os.walk(path) for name in names])
        for file in files:
            stat = os.stat(file)
            if self.sent.get(file) == (stat.st_size, stat.st_mtime_ns):
                continue
            remote = self._remote(os.path.relpath(file, self.local).replace(os.sep, "/"))
            self.fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(file, remote)
            self.sent[file] = (stat.st_size, stat.st_mtime_ns)

    def upload(self) -> None:
        """Brings the remote run up to the staging directory's state: the checkpoints it lacks, then `latest`, the
        checkpoints no longer staged removed, then everything else."""
        staged = os.path.join(self.local, CHECKPOINTS)
        local_steps = sorted(n for n in os.listdir(staged) if n.startswith("step_")) if os.path.isdir(staged) else []
        remote_dir = self._remote(CHECKPOINTS)
        remote_steps = ({p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(remote_dir, detail=False)}
                        if self.fs.exists(remote_dir) else set())
        for name in local_steps:
            if name not in remote_steps:
                self._put(f"{CHECKPOINTS}/{name}")
        if os.path.isfile(os.path.join(staged, "latest")):
            self._put(f"{CHECKPOINTS}/latest")
        for name in remote_steps - set(local_steps) - {"latest"}:
            self.fs.rm(self._remote(f"{CHECKPOINTS}/{name}"), recursive=True)
        for name in os.listdir(self.local):
            if name not in (CHECKPOINTS, LOCK_FILE):  # the lock belongs to this machine's driver
                self._put(name)

    def download(self) -> bool:
        """The remote run into the staging directory; False when there is none."""
        if not self.fs.exists(self.root):
            return False
        prefix = self.root.rstrip("/") + "/"
        for remote in self.fs.find(self.root):
            local = os.path.join(self.local, *remote[len(prefix):].split("/"))
            os.makedirs(os.path.dirname(local), exist_ok=True)
            self.fs.get_file(remote, local)
        return True
