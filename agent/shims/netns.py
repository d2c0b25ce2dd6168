"""Run Python callables inside a network namespace, on a dedicated thread that entered it.

Role: file-level kernel access that depends on the caller's network namespace (/proc/sys/net
sysctls) without starting a process per read or write. `NetnsThread(netns)` owns ONE worker
thread that calls setns(CLONE_NEWNET) once at start and stays in that namespace until
`close()`; `call(fn, *args)` runs fn there and returns its result (or raises its exception).

Invariants: setns affects only the worker thread, never the caller's; with `netns=None` calls
run inline in the caller's own namespace. The worker keeps the namespace alive while open
(it holds a reference), so always `close()` it.

Easy to get wrong: a namespace is per thread in Linux, so anything that must run "in" the
namespace has to run on the worker thread, including opening files under /proc/sys/net.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pyfelix.agent.shims.cmd import netns_path

T = TypeVar("T")

CLONE_NEWNET = 0x40000000


def _enter_netns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


class NetnsThread:
    """One worker thread living in a given network namespace."""

    def __init__(self, netns: str | None) -> None:
        self.netns = netns
        self._executor: ThreadPoolExecutor | None = None
        if netns is not None:
            path = netns_path(netns)
            if not os.path.exists(path):
                raise FileNotFoundError(f"network namespace {netns!r}: {path} does not exist")
            self._executor = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix=f"netns-{os.path.basename(path)}",
                initializer=_enter_netns,
                initargs=(path,),
            )

    def call(self, fn: Callable[..., T], *args: object) -> T:
        if self._executor is None:
            return fn(*args)
        return self._executor.submit(fn, *args).result()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
