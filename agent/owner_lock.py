"""Is a lock file's owner alive? The one test behind every "sweep what a killed run left".

Role: the lab's run directories and the BPF scratch pin directories are each owned by a
process that holds an exclusive flock on a lock file for its whole life. The kernel drops a
flock when its holder dies, however it dies, so a lock that can be taken means its owner is
gone. pids are no substitute: they are reused, and a flock opened O_CLOEXEC is never
inherited by a child by accident.

Input: a lock file's path. Output: True while another process holds it. Taking the lock to
test it releases it again at once; a missing file means no owner.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def lock_is_held(lock: Path) -> bool:
    """True when a live process holds an exclusive flock on `lock` (we could not take it)."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
