"""Helpers for the real-etcd tests: a recorder that timestamps updates, document builders,
and a direct view of what etcd holds (read with a plain range, not with the code under test).
"""

from __future__ import annotations

import json
import time
from typing import Any

from pyfelix.agent.syncer.api import RawUpdate, ResourceKey, SyncStatus
from pyfelix.agent.syncer.etcd_conn import EtcdConfig, EtcdConnection
from pyfelix.agent.syncer.etcd_keys import ETCD_ROOT, parse_etcd_key
from tests.syncer.syncer_testlib import Recorder

CALICO = "projectcalico.org/v3"


class TimedRecorder(Recorder):
    """A Recorder that also notes when each update arrived (time.monotonic())."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[tuple[float, RawUpdate]] = []
        # (status, when, copy of the state at that moment)
        self.status_log: list[tuple[SyncStatus, float, dict[ResourceKey, Any]]] = []

    def on_status(self, status: SyncStatus) -> None:
        with self._cond:
            self.status_log.append((status, time.monotonic(), dict(self.state)))
        super().on_status(status)

    def last_status(self) -> SyncStatus | None:
        with self._cond:
            return self.statuses[-1] if self.statuses else None

    def count(self, status: SyncStatus) -> int:
        with self._cond:
            return self.statuses.count(status)

    def on_updates(self, updates: list[RawUpdate]) -> None:
        now = time.monotonic()
        with self._cond:
            self.arrivals.extend((now, update) for update in updates)
        super().on_updates(updates)

    def arrival_of(self, key: ResourceKey, revision: int) -> float:
        with self._cond:
            for when, update in self.arrivals:
                if update.key == key and update.revision == str(revision):
                    return when
        raise AssertionError(f"no update of {key} at revision {revision}")

    def duplicates(self) -> list[tuple[ResourceKey, str]]:
        """(key, revision) pairs sent more than once."""
        seen: set[tuple[ResourceKey, str]] = set()
        dups: list[tuple[ResourceKey, str]] = []
        for update in self.updates():
            pair = (update.key, update.revision)
            if pair in seen:
                dups.append(pair)
            seen.add(pair)
        return dups

    def updates_of(self, key: ResourceKey) -> list[RawUpdate]:
        return [u for u in self.updates() if u.key == key]


def gnp(name: str, selector: str = "all()", order: float = 100.0) -> dict[str, Any]:
    return {"apiVersion": CALICO, "kind": "GlobalNetworkPolicy", "metadata": {"name": name},
            "spec": {"selector": selector, "order": order,
                     "ingress": [{"action": "Allow"}], "egress": [{"action": "Allow"}]}}


def gnp_key(name: str) -> ResourceKey:
    return ResourceKey("GlobalNetworkPolicy", "", name)


def netset(name: str, namespace: str, nets: list[str]) -> dict[str, Any]:
    return {"apiVersion": CALICO, "kind": "NetworkSet",
            "metadata": {"name": name, "namespace": namespace, "labels": {"role": "db"}},
            "spec": {"nets": nets}}


def pod(name: str, namespace: str, node: str, ip: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"team": name}}}


def etcd_contents(config: EtcdConfig) -> dict[ResourceKey, dict[str, Any]]:
    """Every resource etcd holds under the layout, read directly."""
    connection = EtcdConnection(config.endpoints[0], config)
    try:
        found: dict[ResourceKey, dict[str, Any]] = {}
        for _, kvs in connection.range_pages(ETCD_ROOT.encode()):
            for kv in kvs:
                key = parse_etcd_key(kv.key.decode())
                if key is not None:
                    found[key] = json.loads(kv.value)
        return found
    finally:
        connection.close()


def current_revision(config: EtcdConfig) -> int:
    connection = EtcdConnection(config.endpoints[0], config)
    try:
        return next(connection.range_pages(b"/", page_size=1))[0]
    finally:
        connection.close()
