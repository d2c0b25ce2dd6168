"""A minimal Linux inotify binding through ctypes (no third-party package).

Role: let the file datastore learn which directory entries changed without rescanning.

Inputs: directories to watch (`add_watch`); outputs: `InotifyEvent`s read from a non-blocking
descriptor that callers `select()` on (`fileno()`).

Invariants and what is easy to get wrong:
- A watch is per directory and NOT recursive: the caller adds a watch for every
  subdirectory, including ones created later (IN_CREATE|IN_ISDIR), and must rescan a new
  subdirectory because files may have appeared in it before its watch existed.
- The kernel reports a watch's end with IN_IGNORED (directory deleted, moved away or
  unmounted); its watch descriptor may then be reused for another directory.
- IN_Q_OVERFLOW (wd -1) means events were lost: the only safe answer is a full rescan.
- Construction raises `InotifyUnavailable` when the C library or kernel lacks inotify or
  the per-user instance limit is reached; `add_watch` raises it when the watch limit
  (fs.inotify.max_user_watches) is reached. Callers fall back to polling.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from dataclasses import dataclass

# Event bits, from <sys/inotify.h>.
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000

IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# What the file datastore needs to see in a watched directory.
DIRECTORY_CHANGES = (
    IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
    | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_EXCL_UNLINK | IN_ONLYDIR
)

_EVENT_HEADER = struct.Struct("iIII")  # int wd; uint32 mask, cookie, len; then char name[len]
_READ_SIZE = 64 * 1024
_MAX_READS = 16


class InotifyUnavailable(OSError):
    """inotify cannot be used here (no libc symbol, no kernel support, or a limit reached)."""


@dataclass(frozen=True)
class InotifyEvent:
    wd: int
    mask: int
    cookie: int
    name: str  # entry name inside the watched directory; "" for events about the directory

    @property
    def is_dir(self) -> bool:
        return bool(self.mask & IN_ISDIR)


def _load_libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_init1.restype = ctypes.c_int
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.inotify_rm_watch.restype = ctypes.c_int
    except (OSError, AttributeError) as exc:
        raise InotifyUnavailable(errno.ENOSYS, f"the C library has no inotify: {exc}") from exc
    return libc


def parse_events(buffer: bytes) -> list[InotifyEvent]:
    """Decode a buffer read from an inotify descriptor into events."""
    events: list[InotifyEvent] = []
    offset = 0
    while offset + _EVENT_HEADER.size <= len(buffer):
        wd, mask, cookie, name_len = _EVENT_HEADER.unpack_from(buffer, offset)
        offset += _EVENT_HEADER.size
        raw_name = buffer[offset : offset + name_len]
        offset += name_len
        name = os.fsdecode(raw_name.split(b"\0", 1)[0])
        events.append(InotifyEvent(wd, mask, cookie, name))
    return events


class Inotify:
    """One inotify instance: a non-blocking descriptor plus its watches."""

    def __init__(self) -> None:
        self._libc = _load_libc()
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise InotifyUnavailable(err, f"inotify_init1 failed: {os.strerror(err)}")
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def add_watch(self, path: str, mask: int = DIRECTORY_CHANGES) -> int:
        """Watch a directory; returns the watch descriptor (the same one if already watched).

        Raises FileNotFoundError / NotADirectoryError if the path vanished or is not a
        directory, InotifyUnavailable when the watch limit is reached.
        """
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask)
        if wd >= 0:
            return int(wd)
        err = ctypes.get_errno()
        if err == errno.ENOSPC:
            raise InotifyUnavailable(
                err, f"inotify watch limit reached adding {path} (fs.inotify.max_user_watches)"
            )
        raise OSError(err, os.strerror(err), path)

    def rm_watch(self, wd: int) -> None:
        """Remove a watch; a watch the kernel already dropped is ignored."""
        self._libc.inotify_rm_watch(self._fd, wd)

    def read_events(self) -> list[InotifyEvent]:
        """All events queued now; an empty list if none (never blocks)."""
        chunks: list[bytes] = []
        for _ in range(_MAX_READS):  # bounded: a busy writer cannot keep us here forever
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                break
            if not data:
                break
            chunks.append(data)
        return parse_events(b"".join(chunks)) if chunks else []

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
