"""A small file system: directories and text files addressed by absolute paths."""
from __future__ import annotations

from typing import Annotated

import posixpath

from lopd_ray.envs.envscaler.core import ToolEnvironment, ToolError, tool
from lopd_ray.envs.envscaler.domains.kit import Domain, Draft, Pick, absent, contains, eq, ref

FOLDERS = ("docs", "reports", "photos", "notes", "drafts", "invoices")


class FileSystemEnv(ToolEnvironment):
    def _dir(self, path: str) -> str:
        if path not in self.dirs:
            raise ToolError(f"no directory '{path}'")
        return path

    def _file(self, path: str) -> str:
        if path not in self.files:
            raise ToolError(f"no file '{path}'")
        return path

    def _creatable(self, path: str) -> None:
        if not path.startswith("/") or path.endswith("/") or path in self.files or path in self.dirs:
            raise ToolError(f"'{path}' is not a new absolute path")
        self._dir(posixpath.dirname(path))

    @tool
    def list_dir(self, path: Annotated[str, "absolute directory path, e.g. /home."]) -> dict:
        """The subdirectories and files directly inside a directory."""
        self._dir(path)
        return {"dirs": [p for p in self.dirs if p != path and posixpath.dirname(p) == path],
                "files": [p for p in self.files if posixpath.dirname(p) == path]}

    @tool
    def read_file(self, path: Annotated[str, "absolute file path."]) -> dict:
        """The content of a file."""
        return {"path": path, "content": self.files[self._file(path)]}

    @tool
    def write_file(self, path: Annotated[str, "absolute file path; its directory must exist."],
                   content: Annotated[str, "the new content."]) -> dict:
        """Create a file, or replace the content of an existing one."""
        if path not in self.files:
            self._creatable(path)
        self.files[path] = content
        return {"path": path, "size": len(content)}

    @tool
    def make_dir(self, path: Annotated[str, "absolute path of the new directory."]) -> dict:
        """Create a directory inside an existing one."""
        self._creatable(path)
        self.dirs.append(path)
        return {"path": path}

    @tool
    def move_file(self, source: Annotated[str, "the file to move."],
                  destination: Annotated[str, "the new file path, or an existing directory."]) -> dict:
        """Move or rename a file. A destination that is a directory keeps the file name."""
        self._file(source)
        if destination in self.dirs:
            destination = posixpath.join(destination, posixpath.basename(source))
        self._creatable(destination)
        self.files[destination] = self.files.pop(source)
        return {"path": destination}

    @tool
    def delete_file(self, path: Annotated[str, "the file."]) -> dict:
        """Delete a file."""
        del self.files[self._file(path)]
        return {"path": path, "deleted": True}


def _sentence(pick: Pick) -> str:
    return " ".join(pick.words(6)).capitalize() + "."


def _fs(pick: Pick) -> dict:
    folders = pick.sample(FOLDERS, 3)
    dirs = ["/", "/home"] + [f"/home/{f}" for f in folders]
    files = {f"/home/{folder}/{word}.txt": _sentence(pick) for folder in folders for word in pick.words(3)}
    return {"dirs": dirs, "files": files}


def archive_file(pick: Pick) -> Draft:
    init = _fs(pick)
    source = pick.choice(list(init["files"]))
    target = f"/home/archive-{pick.randint(2019, 2024)}"
    moved = posixpath.join(target, posixpath.basename(source))
    d = Draft(f"Create the directory {target} and move {source} into it.", init)
    d.call("make_dir", path=target)
    d.call("move_file", source=source, destination=target)
    return d.check(contains("dirs", target), eq(("files", moved), init["files"][source]), absent(("files", source)))


def delete_named(pick: Pick) -> Draft:
    init = _fs(pick)
    doomed = pick.choice(list(init["files"]))
    note = f"/home/cleanup-{pick.randint(1, 99)}.txt"
    init["files"][note] = doomed
    d = Draft(f"The file {note} holds the path of a file that is no longer needed. Delete that file.", init)
    c0 = d.call("read_file", path=note)
    d.call("delete_file", path=ref(c0, "content"))
    return d.check(absent(("files", doomed)))


def copy_indexed(pick: Pick) -> Draft:
    init = _fs(pick)
    report = pick.choice(list(init["files"]))
    index = f"/home/{pick.choice(('latest', 'current', 'pointer'))}.txt"
    init["files"][index] = report
    dest = f"/home/{pick.choice(FOLDERS)}-copy-{pick.randint(1, 99)}.txt"
    d = Draft(f"{index} holds the path of a report. Copy that report's content into a new file {dest}.", init)
    c0 = d.call("read_file", path=index)
    c1 = d.call("read_file", path=ref(c0, "content"))
    d.call("write_file", path=dest, content=ref(c1, "content"))
    return d.check(eq(("files", dest), init["files"][report]))


DOMAIN = Domain(
    name="filesystem", env_class=FileSystemEnv,
    introduction="A user's file system with directories and plain-text files.",
    rules=("Paths are absolute.", "A file or directory can only be created inside an existing directory.",
           "Moving or creating never overwrites an existing path."),
    kinds=(archive_file, delete_named, copy_indexed),
)
