"""Sysctl shim: read and write /proc/sys entries of one network namespace, in batches.

Role: the sysctl manager's only kernel access. Paths are relative to /proc/sys with "/"
separators ("net/ipv4/conf/cali1234/rp_filter"), so interface names containing dots need no
escaping.

`ProcSysctls(netns)` does its file I/O on a `NetnsThread` that entered the namespace: /proc/sys/net
shows the namespace of the thread that opens the file.

Outputs: `read_many` -> {path: value or None when the entry does not exist};
`write_many` -> {path: error} for the writes that failed (an interface can vanish between a
read and a write; the caller decides what is fatal).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Protocol

from pyfelix.agent.shims.netns import NetnsThread

PROC_SYS = "/proc/sys"


def _check_path(path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"sysctl path {path!r}: must be relative to /proc/sys, no '..'")
    return os.path.join(PROC_SYS, path)


class Sysctls(Protocol):
    def read_many(self, paths: Iterable[str]) -> dict[str, str | None]: ...

    def write_many(self, values: Mapping[str, str]) -> dict[str, OSError]: ...

    def close(self) -> None: ...


def _read_all(paths: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for path in paths:
        try:
            with open(_check_path(path)) as f:
                out[path] = f.read().strip()
        except (FileNotFoundError, NotADirectoryError):
            out[path] = None
    return out


def _write_all(values: dict[str, str]) -> dict[str, OSError]:
    errors: dict[str, OSError] = {}
    for path, value in values.items():
        try:
            with open(_check_path(path), "w") as f:
                f.write(value)
        except OSError as exc:
            errors[path] = exc
    return errors


class ProcSysctls:
    """Real sysctls of a namespace (None: the agent's own namespace)."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self._thread = NetnsThread(netns)

    def read_many(self, paths: Iterable[str]) -> dict[str, str | None]:
        return self._thread.call(_read_all, list(paths))

    def write_many(self, values: Mapping[str, str]) -> dict[str, OSError]:
        return self._thread.call(_write_all, dict(values))

    def close(self) -> None:
        self._thread.close()
