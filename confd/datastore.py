"""Where confd gets the datastore from: a syncer for the loop, a one-shot read for `render`.

Role: pick the backend from a `--datastore` value through `agent.syncer.client` (the factory
every pyfelix command uses) and, for a one-shot read, list it once.

Inputs: a `--datastore` value (directory / YAML file / etcd3:// / kubernetes / typha://).
Outputs: a `Syncer` (`open_syncer`), or the current updates and errors (`read_once`).
Errors: `DatastoreUnavailable` with a message fit for the user.

Invariant: `read_once` returns only after the backend reported IN_SYNC (a partial listing
would render a config missing peers), or raises after `timeout` seconds.
"""

from __future__ import annotations

import threading

from pyfelix.agent.datastore import DatastoreLocation, make_syncer
from pyfelix.agent.syncer.api import DatastoreError, RawUpdate, Syncer, SyncStatus
from pyfelix.agent.syncer.client import DatastoreClientError


class DatastoreUnavailable(RuntimeError):
    """The datastore could not be opened or listed; the message names it."""


def open_syncer(location: DatastoreLocation) -> Syncer:
    try:
        return make_syncer(location, syncer_type="bgp")
    except DatastoreClientError as exc:
        raise DatastoreUnavailable(str(exc)) from exc


class _Collector:
    def __init__(self) -> None:
        self.current: dict[object, RawUpdate] = {}
        self.errors: list[DatastoreError] = []
        self.in_sync = threading.Event()

    def on_status(self, status: SyncStatus) -> None:
        if status is SyncStatus.IN_SYNC:
            self.in_sync.set()

    def on_updates(self, updates: list[RawUpdate]) -> None:
        if self.in_sync.is_set():
            return  # a snapshot: changes after the first in-sync belong to a later read
        for update in updates:
            if update.value is None:
                self.current.pop(update.key, None)
            else:
                self.current[update.key] = update

    def on_error(self, error: DatastoreError) -> None:
        self.errors.append(error)


def read_once(location: DatastoreLocation, *,
              timeout: float = 30.0) -> tuple[list[RawUpdate], list[DatastoreError]]:
    """The datastore's current resources (sorted by key) and the errors met listing them."""
    if location.backend == "file":
        from pyfelix.agent.syncer.file import load_path

        try:
            return load_path(location.path)
        except FileNotFoundError as exc:
            raise DatastoreUnavailable(f"--datastore {location}: {exc.strerror}") from exc
    syncer = open_syncer(location)
    collector = _Collector()
    syncer.start(collector)
    try:
        if not collector.in_sync.wait(timeout):
            raise DatastoreUnavailable(f"--datastore {location}: not in sync after {timeout} s")
    finally:
        syncer.stop()
    updates = [collector.current[k] for k in sorted(collector.current)]  # type: ignore[type-var]
    return updates, collector.errors
