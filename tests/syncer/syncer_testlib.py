"""Helpers for the syncer tests: document builders, a recording SyncerCallbacks, settle()."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from pyfelix.agent.syncer.api import DatastoreError, RawUpdate, ResourceKey, SyncStatus

CALICO = "projectcalico.org/v3"


def gnp(name: str, selector: str = "all()", order: float | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": selector}
    if order is not None:
        spec["order"] = order
    return {"apiVersion": CALICO, "kind": "GlobalNetworkPolicy", "metadata": {"name": name},
            "spec": spec}


def netpol(name: str, namespace: str, selector: str = "all()") -> dict[str, Any]:
    return {"apiVersion": CALICO, "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"selector": selector}}


def gnp_key(name: str) -> ResourceKey:
    return ResourceKey("GlobalNetworkPolicy", "", name)


def yaml_docs(*docs: dict[str, Any]) -> str:
    return yaml.safe_dump_all(list(docs), sort_keys=False)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class Recorder:
    """SyncerCallbacks that keeps the merged state, every batch, errors and statuses."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.statuses: list[SyncStatus] = []
        self.batches: list[list[RawUpdate]] = []
        self.errors: list[DatastoreError] = []
        self.events: list[tuple[str, Any]] = []  # ("status", s) / ("updates", n) in order
        self.state: dict[ResourceKey, dict[str, Any]] = {}

    def on_status(self, status: SyncStatus) -> None:
        with self._cond:
            self.statuses.append(status)
            self.events.append(("status", status))
            self._cond.notify_all()

    def on_updates(self, updates: list[RawUpdate]) -> None:
        with self._cond:
            self.batches.append(list(updates))
            self.events.append(("updates", len(updates)))
            for update in updates:
                if update.value is None:
                    assert update.key in self.state, f"delete of unknown key {update.key}"
                    del self.state[update.key]
                else:
                    self.state[update.key] = update.value
            self._cond.notify_all()

    def on_error(self, error: DatastoreError) -> None:
        with self._cond:
            self.errors.append(error)
            self._cond.notify_all()

    def updates(self) -> list[RawUpdate]:
        with self._cond:
            return [u for batch in self.batches for u in batch]

    def wait_for(self, predicate: Callable[[Recorder], bool], what: str,
                 timeout: float = 10.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self), timeout):
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what}; state keys="
                    f"{sorted(self.state)}, statuses={self.statuses}, errors={self.errors}")

    def wait_in_sync(self) -> None:
        self.wait_for(lambda r: SyncStatus.IN_SYNC in r.statuses, "in-sync")


def settle(recorder: Recorder, directory: Path, marker: str, since: int) -> list[RawUpdate]:
    """Write a sentinel resource and wait until it arrives: every earlier change has then
    been processed. Returns the other updates that arrived after the first `since`."""
    sentinel = gnp_key(f"sentinel-{marker}")
    write(directory / f"zz-sentinel-{marker}.yaml", yaml_docs(gnp(f"sentinel-{marker}")))
    recorder.wait_for(lambda r: sentinel in r.state, f"sentinel {marker}")
    return [u for u in recorder.updates()[since:] if u.key != sentinel]
