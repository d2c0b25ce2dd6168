"""Network-namespace primitives for the lab: create, enter (per thread), list, remove, reap.

Role: the lab's narrow shim over namespaces. Named namespaces are bind mounts under
/run/netns (so `ip netns list` shows them and `ip netns exec` works); `in_netns()` moves
only the CALLING THREAD into a namespace and back, which is how the lab creates sockets
(servers, probes) and writes per-namespace sysctls without a helper process.

Inputs: namespace names chosen by `lab.naming`.
Outputs: side effects on those namespaces only.

Invariants:
- A socket belongs to the namespace its creating thread was in at `socket()` time and keeps
  it for life, whichever thread uses it later; `/proc/sys/net` resolves against the calling
  thread's namespace too. Both are what `in_netns()` relies on.
- `in_netns()` always returns the thread to the namespace it came from; if that ever fails
  it raises `NetnsEscapeError`, because a thread silently left in a lab namespace would do
  later work in the wrong place.
- `remove_netns` unmounts a name; the kernel frees the namespace (and the veths in it) once
  no process, socket or mount refers to it. `processes_in_netns` finds such processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pyroute2 import netns as pyroute2_netns

NETNS_RUN_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
_HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}

_libc = ctypes.CDLL(None, use_errno=True)


class NetnsEscapeError(RuntimeError):
    """A thread could not return to its own network namespace."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the body with the calling thread inside namespace `name`.

    In the main thread, SIGINT/SIGTERM are held back for the duration: Python runs signal
    handlers in the main thread between bytecodes, and a handler that raised between entering
    and leaving would otherwise strand the thread in the lab namespace.
    """
    previous_mask = None
    if threading.current_thread() is threading.main_thread():
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        with _switched_to(name):
            yield
    finally:
        if previous_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)


@contextlib.contextmanager
def _switched_to(name: str) -> Iterator[None]:
    home_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target_fd = os.open(NETNS_RUN_DIR / name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target_fd)
        finally:
            os.close(target_fd)
        try:
            yield
        finally:
            try:
                _setns(home_fd)
            except OSError as exc:
                raise NetnsEscapeError(f"thread stuck in netns {name}: {exc}") from exc
    finally:
        os.close(home_fd)


def create_netns(name: str) -> None:
    """Create a named namespace (fails if the name exists)."""
    if (NETNS_RUN_DIR / name).exists():
        raise FileExistsError(errno.EEXIST, "netns exists", name)
    pyroute2_netns.create(name)


def remove_netns(name: str) -> None:
    """Unmount and unlink a named namespace; a missing one is not an error."""
    if (NETNS_RUN_DIR / name).exists():
        pyroute2_netns.remove(name)


def list_netns() -> list[str]:
    """Names under /run/netns (what `ip netns list` shows)."""
    try:
        return sorted(os.listdir(NETNS_RUN_DIR))
    except FileNotFoundError:
        return []


def write_sysctl(netns_name: str, key: str, value: str) -> None:
    """`sysctl -w key=value` inside a namespace, e.g. key `net.ipv4.ip_forward`."""
    path = Path("/proc/sys") / key.replace(".", "/")
    with in_netns(netns_name):
        path.write_text(value)


def read_sysctl(netns_name: str, key: str) -> str:
    path = Path("/proc/sys") / key.replace(".", "/")
    with in_netns(netns_name):
        return path.read_text().strip()


def processes_in_netns(name: str) -> list[int]:
    """Pids of processes whose network namespace is the named one (excluding ourselves)."""
    try:
        target = os.stat(NETNS_RUN_DIR / name).st_ino
    except FileNotFoundError:
        return []
    own = os.getpid()
    pids: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/net").st_ino == target:
                pids.append(int(entry.name))
        except OSError:
            continue  # exited meanwhile, or a kernel thread we may not inspect
    return pids


def kill_processes_in_netns(name: str, grace_seconds: float = 2.0) -> list[int]:
    """SIGTERM every process in the namespace, SIGKILL those left after the grace period."""
    pids = processes_in_netns(name)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    remaining = pids
    while remaining and time.monotonic() < deadline:
        time.sleep(0.05)
        remaining = [pid for pid in remaining if _alive(pid)]
    for pid in remaining:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # a zombie ("Z") has exited; its parent just has not reaped it yet
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
