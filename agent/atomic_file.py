"""Whole-file replacement that a planted symlink cannot redirect.

Role: the agent's status file and confd's staged BIRD config are written by root into
directories other users may be able to write (a hostPath, /tmp in a lab). A fixed temporary
name (`status.json.tmp`) opened with O_CREAT|O_TRUNC follows whatever sits there, so a
symlink planted at that name makes root truncate and fill any file on the host. This module
writes such files so that readers see the old or the new content, never a part, and nothing
outside the destination's directory entry is ever written.

How (`write_atomically`, `StagedFile`):
1. Open the destination's DIRECTORY once (O_DIRECTORY) and do every step relative to that
   descriptor, so the temporary file and the rename stay in one directory.
2. Create the temporary file under a random name (`.<name>.<16 hex digits>.tmp`) with
   O_CREAT|O_EXCL|O_NOFOLLOW: if any entry of that name exists (a symlink, a file, a fifo)
   the open fails instead of following or reusing it, and another random name is tried.
3. Write through the descriptor, set the mode with fchmod (not subject to the umask),
   optionally fsync, then rename() over the final name. rename replaces a symlink at the
   final name instead of following it, so a link planted there is gone, not written through.
   On any failure the temporary file is removed.

Not protected: the directory itself. Whoever can rename or replace it (write access to its
parent) can already make any path of the agent point anywhere; the operator chooses it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NAME_ATTEMPTS = 16


def temporary_name(final_name: str) -> str:
    """A fresh random hidden name beside `final_name` (callers never reuse one)."""
    return f".{final_name}.{secrets.token_hex(8)}.tmp"


def _open_directory(directory: str) -> int:
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _create_exclusive(dir_fd: int, final_name: str, mode: int) -> tuple[int, str]:
    """A new file under a random name in `dir_fd`; raises FileExistsError if every one of
    `_NAME_ATTEMPTS` random names was taken (someone is planting entries at our names)."""
    for _ in range(_NAME_ATTEMPTS):
        name = temporary_name(final_name)
        try:
            return os.open(name, _CREATE_FLAGS, mode, dir_fd=dir_fd), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {final_name} after "
                          f"{_NAME_ATTEMPTS} attempts")


class StagedFile:
    """A temporary file beside `path`, filled by `write()`, put in place by `commit()` or
    removed by `discard()` (also when used as a context manager and the block raises).

    `path` is the temporary file's own path, for a program that must read it before it
    goes live (confd runs `bird -p -c` on it)."""

    def __init__(self, path: str | os.PathLike[str], *, mode: int = 0o644,
                 sync: bool = False) -> None:
        destination = os.fspath(path)
        directory, self.final_name = os.path.split(destination)
        if not self.final_name:
            raise IsADirectoryError(f"{destination!r} names a directory, not a file")
        self.directory = directory or "."
        self._sync = sync
        self._dir_fd = _open_directory(self.directory)
        try:
            self._fd, self.name = _create_exclusive(self._dir_fd, self.final_name, mode)
            os.fchmod(self._fd, mode)
        except BaseException:
            os.close(self._dir_fd)
            raise
        self._done = False

    @property
    def path(self) -> Path:
        return Path(self.directory) / self.name

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def _close_file(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                if self._sync:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def commit(self) -> None:
        """Rename the temporary file over the destination (replacing, never following, a
        symlink there)."""
        if self._done:
            raise RuntimeError("staged file already committed or discarded")
        try:
            self._close_file()
            os.rename(self.name, self.final_name, src_dir_fd=self._dir_fd,
                      dst_dir_fd=self._dir_fd)
            if self._sync:
                os.fsync(self._dir_fd)
        except BaseException:
            self.discard()
            raise
        self._finish()

    def discard(self) -> None:
        """Remove the temporary file (nothing happens to the destination)."""
        if self._done:
            return
        try:
            self._close_file()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.name, dir_fd=self._dir_fd)
            self._finish()

    def _finish(self) -> None:
        self._done = True
        os.close(self._dir_fd)

    def __enter__(self) -> StagedFile:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is not None or not self._done:
            self.discard()


def write_atomically(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644,
                     sync: bool = False) -> None:
    """Replace the file at `path` with `data` (see module docstring); raises OSError."""
    with StagedFile(path, mode=mode, sync=sync) as staged:
        staged.write(data)
        staged.commit()
