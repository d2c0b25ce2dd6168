"""Scratch pin directories: BPF builds that live only as long as the process that made them.

Role: benchmarks (`pyfelix bench bpf-verdict`, `services`), `python -m
pyfelix.agent.bpf.measure` and the BPF tests load a build of their own, pinned under the
host's bpffs. A `finally` removes it, but a SIGKILL (or a SIGTERM to a process without a
handler) skips every `finally`, and the directory used to stay behind for good.

`scratch_pin_dir(tag)` yields `/sys/fs/bpf/pyfelix-scratch-<tag>-<hex>`:
- before the directory can exist, a lock file `/run/pyfelix-scratch/<name>.lock` is created
  and held (exclusive flock, O_CLOEXEC) for the whole context; the kernel releases it when
  the process dies, however it dies;
- on exit (normal or exception) the pins and directory go, then the lock file;
- and first of all, `sweep_stale_scratch()` removes every `pyfelix-scratch-*` directory whose
  lock file is missing or not held: what a killed process left. `pyfelix lab sweep` runs the
  same sweep.

Invariants: a directory is removed only when no live process holds its lock (the lock is
taken before the directory is made and dropped after it is gone, so "no lock file" or "lock
not held" means its owner is gone); nothing outside the `pyfelix-scratch-` names is touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

from pyfelix.agent.bpf.loader import remove_pin_dir
from pyfelix.agent.owner_lock import lock_is_held

BPFFS_ROOT = Path("/sys/fs/bpf")
LOCK_ROOT = Path("/run/pyfelix-scratch")
PREFIX = "pyfelix-scratch-"
_TAG = re.compile(r"[a-z0-9-]{1,24}")


def _lock_path(name: str, lock_root: Path) -> Path:
    return lock_root / f"{name}.lock"


def sweep_stale_scratch(bpffs_root: Path = BPFFS_ROOT,
                        lock_root: Path = LOCK_ROOT) -> list[str]:
    """Remove the scratch pin directories whose owner is gone; returns their names."""
    removed: list[str] = []
    if not bpffs_root.is_dir():
        return removed
    for entry in sorted(bpffs_root.iterdir()):
        if not entry.name.startswith(PREFIX):
            continue
        lock = _lock_path(entry.name, lock_root)
        if lock_is_held(lock):
            continue
        remove_pin_dir(str(entry))
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        removed.append(entry.name)
    return removed


@contextlib.contextmanager
def scratch_pin_dir(tag: str, *, bpffs_root: Path = BPFFS_ROOT,
                    lock_root: Path = LOCK_ROOT) -> Iterator[str]:
    """A pin directory for this process's own build (module docstring); not created here:
    `load_dataplane` makes it."""
    if not _TAG.fullmatch(tag):
        raise ValueError(f"scratch pin dir tag {tag!r}: lower-case letters, digits and '-'")
    sweep_stale_scratch(bpffs_root, lock_root)
    name = f"{PREFIX}{tag}-{secrets.token_hex(4)}"
    lock_root.mkdir(parents=True, exist_ok=True)
    lock = _lock_path(name, lock_root)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = bpffs_root / name
        try:
            yield str(path)
        finally:
            remove_pin_dir(str(path))
            lock.unlink(missing_ok=True)
    finally:
        os.close(fd)
