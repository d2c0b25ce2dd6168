"""The confd loop: watch the datastore, render bird.conf, check it, swap it in, reload BIRD.

Role: `ConfdReconciler` is the synchronous heart (no threads; tests drive it directly);
`ConfdLoop` adds the syncer, a queue and a thread, and coalesces bursts of updates.

Inputs: syncer callbacks (status, RawUpdates, errors); the node name; the path of the config
file BIRD was started with (`-c`) and its control socket (`-s`).
Outputs: the config file (written only with text that `bird -p` accepted) and `birdc
configure` calls; module-level Prometheus counters.

Each reconcile, once the syncer is in sync and something changed:
  compute + render -> same text as the running config? nothing to do
  -> write a staged file beside the config, `<dir>/.<name>.<random>.tmp`, created with
     O_EXCL|O_NOFOLLOW (mode 0600: it may hold BGP passwords; `agent.atomic_file`: a
     symlink planted at a staged name or at the config file's name is never written
     through), fsync
  -> `bird -p -c staged`: rejected? keep the running config, log why, count it, delete the
     staged file; the next datastore change tries again
  -> rename over the config file (atomic; replaces a symlink there instead of following it)
  -> `birdc configure`: failed (BIRD down, busy)?
     count it and retry the reload every `reload_retry_interval` seconds until it works
     (a BIRD started later reads the new file by itself anyway).

An unexpected exception in a step (disk full, a bug) is logged and the step retried every
`reload_retry_interval` seconds: the loop thread never dies.

A changed Secret (a BGP password) is a changed state like any other: the config is rendered
again and BIRD reloaded when the text differs. The config file and the staged file are
mode 0600; passwords appear nowhere else (notes, logs and errors name the Secret only).

Invariants: the config file only ever holds checked text; nothing is written before the
syncer's first IN_SYNC (a half-listed datastore would drop peers); a render error (e.g. this
node's Node resource lacks bgp.ipv4Address) keeps the running config too.
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import Counter

from pyfelix.agent.atomic_file import StagedFile
from pyfelix.agent.syncer.api import DatastoreError, RawUpdate, Syncer, SyncStatus
from pyfelix.confd.bgp_config import DEFAULT_INTERFACE_PREFIX, ConfdError, compute_bird_config
from pyfelix.confd.bgp_view import BGPView
from pyfelix.confd.bird import BirdResult, BirdTools
from pyfelix.confd.render import render_bird_config

log = logging.getLogger(__name__)

BIRD_CHECK_FAILURES = Counter(
    "pyfelix_confd_bird_check_failures_total",
    "Rendered BIRD configurations that `bird -p` rejected; the running configuration was kept.",
)
RELOADS = Counter(
    "pyfelix_confd_reloads_total",
    "Successful `birdc configure` reloads of a new BIRD configuration.",
)
RELOAD_FAILURES = Counter(
    "pyfelix_confd_reload_failures_total",
    "Failed `birdc configure` attempts (BIRD not running or refusing); they are retried.",
)
RENDER_FAILURES = Counter(
    "pyfelix_confd_render_failures_total",
    "Datastore states for which no BIRD configuration could be computed for this node.",
)


class Outcome(enum.Enum):
    WAITING_FOR_SYNC = "waiting-for-sync"
    UNCHANGED = "unchanged"
    RENDER_FAILED = "render-failed"
    CHECK_FAILED = "check-failed"
    RELOADED = "reloaded"
    RELOAD_FAILED = "reload-failed"
    ERROR = "error"  # an unexpected exception (disk full, a bug): retried after a pause


class ConfdReconciler:
    """Datastore view -> checked config file -> reloaded BIRD, one step at a time."""

    def __init__(self, hostname: str, config_path: str | os.PathLike[str],
                 socket_path: str | os.PathLike[str], *, tools: BirdTools | None = None,
                 interface_prefix: str = DEFAULT_INTERFACE_PREFIX,
                 secret_namespace: str | None = None) -> None:
        self.hostname = hostname
        self.config_path = Path(config_path)
        self.socket_path = Path(socket_path)
        self.staged_path: Path | None = None  # the staged file while one exists
        self.tools = tools or BirdTools()
        self.interface_prefix = interface_prefix
        self.view = BGPView(secret_namespace=secret_namespace)  # None: $NAMESPACE/kube-system
        self.in_sync = False
        self.dirty = True
        self.reload_pending = False
        self.applied_text: str | None = None  # text in the config file, accepted by bird -p
        self.last_error = ""

    # -- inputs --

    def on_status(self, status: SyncStatus) -> None:
        if status is SyncStatus.IN_SYNC and not self.in_sync:
            self.dirty = True
        self.in_sync = self.in_sync or status is SyncStatus.IN_SYNC

    def on_updates(self, updates: list[RawUpdate]) -> None:
        if self.view.apply_all(updates):
            self.dirty = True

    # -- the step --

    def render(self) -> str:
        """This node's bird.conf text from the current view; raises ConfdError."""
        config = compute_bird_config(self.view.snapshot(), self.hostname,
                                     interface_prefix=self.interface_prefix,
                                     problems=self.view.problems())
        for note in config.notes:
            log.warning("confd: %s", note)
        return render_bird_config(config)

    def reconcile(self) -> Outcome:
        if not self.in_sync:
            return Outcome.WAITING_FOR_SYNC
        if self.dirty:
            self.dirty = False
            outcome = self._apply_new_state()
            if outcome is not Outcome.UNCHANGED:
                return outcome
        if self.reload_pending:
            return self._reload()
        return Outcome.UNCHANGED

    def _apply_new_state(self) -> Outcome:
        try:
            text = self.render()
        except ConfdError as exc:
            RENDER_FAILURES.inc()
            self.last_error = str(exc)
            log.error("confd: cannot render BIRD config, keeping the running one: %s", exc)
            return Outcome.RENDER_FAILED
        if text == self.applied_text:
            return Outcome.UNCHANGED
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        with StagedFile(self.config_path, mode=0o600, sync=True) as staged:
            self.staged_path = staged.path
            try:
                staged.write(text.encode())
                check = self.tools.check(staged.path)
                if not check.ok:
                    BIRD_CHECK_FAILURES.inc()
                    self.last_error = f"bird -p rejected the new config: {check.message}"
                    log.error("confd: %s; keeping the running config", self.last_error)
                    return Outcome.CHECK_FAILED  # the staged file is discarded on the way out
                staged.commit()
            finally:
                self.staged_path = None
        self.applied_text = text
        self.reload_pending = True
        return self._reload()

    def _reload(self) -> Outcome:
        result: BirdResult = self.tools.configure(self.socket_path)
        if result.ok:
            RELOADS.inc()
            self.reload_pending = False
            self.last_error = ""
            log.info("confd: BIRD reloaded with the new config (%s)", self.config_path)
            return Outcome.RELOADED
        RELOAD_FAILURES.inc()
        self.last_error = f"birdc configure failed: {result.message}"
        log.warning("confd: %s; will retry", self.last_error)
        return Outcome.RELOAD_FAILED


class ConfdLoop:
    """Runs a syncer into a `ConfdReconciler` on a thread, coalescing bursts of updates.

    `debounce`: quiet time after an update before reconciling (at most `max_delay` after the
    first one). `on_outcome` (optional) is called with each reconcile's outcome (tests, lab).
    """

    def __init__(self, syncer: Syncer, reconciler: ConfdReconciler, *,
                 debounce: float = 0.05, max_delay: float = 0.5,
                 reload_retry_interval: float = 2.0,
                 on_outcome: Callable[[Outcome], None] | None = None) -> None:
        self.syncer = syncer
        self.reconciler = reconciler
        self._debounce = debounce
        self._max_delay = max_delay
        self._retry_interval = reload_retry_interval
        self._on_outcome = on_outcome
        self._events: queue.Queue[tuple[str, object]] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # SyncerCallbacks (called on the syncer's thread)
    def on_status(self, status: SyncStatus) -> None:
        self._events.put(("status", status))

    def on_updates(self, updates: list[RawUpdate]) -> None:
        self._events.put(("updates", updates))

    def on_error(self, error: DatastoreError) -> None:
        log.error("confd: datastore error: %s", error)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("ConfdLoop already started")
        self._thread = threading.Thread(target=self.run, name="confd", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._events.put(("stop", None))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def run(self) -> None:
        """The loop body; returns after stop(). Starts and stops the syncer."""
        self.syncer.start(self)
        failed = False
        try:
            while not self._stop.is_set():
                retry = failed or self.reconciler.reload_pending
                if not self._drain(self._retry_interval if retry else None):
                    continue
                try:
                    outcome = self.reconciler.reconcile()
                except Exception:
                    log.exception("confd: reconcile failed unexpectedly; retrying in %s s",
                                  self._retry_interval)
                    self.reconciler.dirty = True
                    outcome = Outcome.ERROR
                failed = outcome is Outcome.ERROR
                if self._on_outcome is not None:
                    self._on_outcome(outcome)
        finally:
            self.syncer.stop()

    def _drain(self, timeout: float | None) -> bool:
        """Wait for events (or the retry timeout), then coalesce a burst. False on stop."""
        try:
            first = self._events.get(timeout=timeout)
        except queue.Empty:
            return True  # retry a pending reload or a failed reconcile
        if not self._handle(first):
            return False
        deadline = time.monotonic() + self._max_delay
        while True:
            wait = min(self._debounce, deadline - time.monotonic())
            if wait <= 0:
                return True
            try:
                event = self._events.get(timeout=wait)
            except queue.Empty:
                return True
            if not self._handle(event):
                return False

    def _handle(self, event: tuple[str, object]) -> bool:
        kind, payload = event
        if kind == "stop":
            return False
        if kind == "status":
            assert isinstance(payload, SyncStatus)
            self.reconciler.on_status(payload)
        elif kind == "updates":
            assert isinstance(payload, list)
            self.reconciler.on_updates(payload)
        return True


def run_until(loop: ConfdLoop, stop: threading.Event) -> None:
    """Run `loop` until `stop` is set (by a signal handler, a test, the agent), then stop it."""
    loop.start()
    try:
        while not stop.wait(0.2):  # short: a signal handler sets `stop`
            pass
    finally:
        loop.stop()
