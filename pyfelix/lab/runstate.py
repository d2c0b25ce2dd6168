"""Per-run state directory, its liveness lock, and the sweep of stale lab runs.

Role: know which lab runs are alive, and clean up after those that are not (a SIGKILLed
`pyfelix lab run`, a crashed test), without ever touching a live run or something not ours.

Inputs: the run-state root (/run/pyfelix-lab), the bpffs root, the names under /run/netns.
Outputs: `RunState` (held by a live run) and `SweepReport` (what a sweep removed or skipped).

Invariants:
- A run creates `<root>/<run id>/` and holds an exclusive flock on its `lock` file BEFORE it
  creates any namespace, and removes the directory only AFTER its namespaces are gone. So a
  lab namespace `pf<hex>-...` whose run directory exists with an unheld lock is stale, and
  one whose directory is held belongs to a live run. The lock dies with the process, even
  on SIGKILL; pids can be reused, flocks cannot be inherited by accident (O_CLOEXEC).
- The directory is prepared under a hidden name and renamed into place once locked, so a
  concurrent sweep never sees a run directory whose lock is not yet held.
- Lab-named namespaces WITHOUT a run directory are not provably ours: the sweep reports them
  and removes them only when asked (`include_orphans=True`).
- Removing a run: kill processes left in its namespaces (agents, BIRD), delete the
  namespaces (the kernel deletes the veths in them), its bpffs directory, then its state dir.
- Every sweep also removes the scratch pin directories of dead processes (benchmarks' and
  tests' own BPF builds, `agent.bpf.scratch`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyfelix.agent.bpf.scratch import sweep_stale_scratch
from pyfelix.agent.owner_lock import lock_is_held
from pyfelix.lab import naming
from pyfelix.lab.netns import kill_processes_in_netns, list_netns, remove_netns

LOCK_FILE = "lock"
PID_FILE = "pid"
DATASTORE_DIR = "datastore"
STAGING_DIR = "staging"
# A hidden, unlocked staging dir older than this belongs to a run that died while starting.
STALE_STAGING_SECONDS = 60.0


class RunState:
    """The run's directory under the state root, locked for as long as the run lives."""

    def __init__(self, run_id: str, root: Path = naming.RUN_STATE_ROOT) -> None:
        self.run_id = run_id
        self.root = root
        self.path = naming.run_state_dir(run_id, root)
        self._lock_fd: int | None = None

    @property
    def datastore_dir(self) -> Path:
        return self.path / DATASTORE_DIR

    @property
    def staging_dir(self) -> Path:
        return self.path / STAGING_DIR

    @property
    def held(self) -> bool:
        return self._lock_fd is not None

    def acquire(self) -> None:
        """Create, lock and publish the run directory (fails if the run id is taken)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            raise FileExistsError(errno.EEXIST, "lab run directory exists", str(self.path))
        hidden = self.root / f".{self.run_id}"
        hidden.mkdir()
        fd = os.open(hidden / LOCK_FILE, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            (hidden / PID_FILE).write_text(f"{os.getpid()}\n")
            (hidden / DATASTORE_DIR).mkdir()
            (hidden / STAGING_DIR).mkdir()
            try:
                os.rename(hidden, self.path)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise FileExistsError(exc.errno, "lab run directory exists",
                                          str(self.path)) from exc
                raise
        except BaseException:
            os.close(fd)
            shutil.rmtree(hidden, ignore_errors=True)
            raise
        self._lock_fd = fd

    def release(self) -> None:
        """Remove the directory, then drop the lock (in that order: see module invariants)."""
        if self._lock_fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = None


def run_is_alive(run_dir: Path) -> bool:
    """True when some process holds the run's lock."""
    return lock_is_held(run_dir / LOCK_FILE)


def run_netns_names(run_id: str) -> list[str]:
    """The lab namespaces of one run, pods first, underlay last (teardown order)."""
    names = [n for n in list_netns() if naming.parse_run_id(n) == run_id]
    return sorted(names, key=_teardown_rank)


def _teardown_rank(name: str) -> tuple[int, str]:
    role = name.split("-", 1)[1]
    order = 2 if role == naming.UNDERLAY_ROLE else 1 if role.startswith("n") else 0
    return order, name


def remove_run_kernel_objects(
    run_id: str, bpffs_root: Path = naming.BPFFS_ROOT
) -> tuple[list[str], list[int], list[str]]:
    """Kill leftover processes and delete a run's namespaces and bpffs directory.

    Returns (namespaces removed, pids signalled, errors). Safe to call repeatedly.
    """
    removed: list[str] = []
    killed: list[int] = []
    errors: list[str] = []
    names = run_netns_names(run_id)
    for name in names:
        try:
            killed.extend(kill_processes_in_netns(name))
        except OSError as exc:
            errors.append(f"killing processes in {name}: {exc}")
    for name in names:
        try:
            remove_netns(name)
            removed.append(name)
        except OSError as exc:
            errors.append(f"removing netns {name}: {exc}")
    bpffs_dir = naming.run_bpffs_dir(run_id, bpffs_root)
    if bpffs_dir.exists():
        try:
            shutil.rmtree(bpffs_dir)
        except OSError as exc:
            errors.append(f"removing {bpffs_dir}: {exc}")
    return removed, killed, errors


@dataclass
class SweepReport:
    removed_netns: list[str] = field(default_factory=list)
    removed_runs: list[str] = field(default_factory=list)
    killed_pids: list[int] = field(default_factory=list)
    live_runs: list[str] = field(default_factory=list)
    orphan_netns: list[str] = field(default_factory=list)
    removed_scratch_pin_dirs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def sweep_stale_runs(
    root: Path = naming.RUN_STATE_ROOT,
    bpffs_root: Path = naming.BPFFS_ROOT,
    *,
    include_orphans: bool = False,
) -> SweepReport:
    """Remove every lab run that is not alive; never touches a live run's objects."""
    report = SweepReport()
    run_ids = {naming.parse_run_id(n) for n in list_netns()} - {None}
    if root.is_dir():
        run_ids |= {p.name for p in root.iterdir() if naming.RUN_ID_PATTERN.fullmatch(p.name)}
    for run_id in sorted(r for r in run_ids if r is not None):
        run_dir = naming.run_state_dir(run_id, root)
        if run_dir.is_dir():
            if run_is_alive(run_dir):
                report.live_runs.append(run_id)
                continue
        elif not include_orphans:
            report.orphan_netns.extend(run_netns_names(run_id))
            continue
        removed, killed, errors = remove_run_kernel_objects(run_id, bpffs_root)
        report.removed_netns.extend(removed)
        report.killed_pids.extend(killed)
        report.errors.extend(errors)
        if not errors:
            shutil.rmtree(run_dir, ignore_errors=True)
            report.removed_runs.append(run_id)
    _sweep_stale_staging(root)
    try:  # in-process BPF builds of killed benchmarks and tests (agent.bpf.scratch)
        report.removed_scratch_pin_dirs = sweep_stale_scratch(bpffs_root)
    except OSError as exc:
        report.errors.append(f"sweeping scratch pin directories: {exc}")
    return report


def _sweep_stale_staging(root: Path) -> None:
    """Hidden `.pf<hex>` dirs of runs that died between mkdir and publishing their dir."""
    if not root.is_dir():
        return
    now = time.time()
    for path in root.iterdir():
        if not (path.name.startswith(".") and naming.RUN_ID_PATTERN.fullmatch(path.name[1:])):
            continue
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > STALE_STAGING_SECONDS and not run_is_alive(path):
                shutil.rmtree(path, ignore_errors=True)
