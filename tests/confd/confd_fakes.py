"""Stateful fakes and document builders for confd unit tests.

- `FakeBird`: a BIRD as confd sees it through `BirdTools`: `check(path)` accepts or rejects a
  file (by a predicate on its text, default: the real `bird -p` rules are NOT emulated, only
  `reject_when`), `configure(socket)` loads the config file from disk into `running_config`
  (like BIRD re-reading its `-c` file) unless BIRD is `down`. It records the texts it was
  asked to check, so tests can assert what reached BIRD, not which calls were made.
- `FakeSyncer`: a syncer the test drives (`send`, `status`), delivering on the caller thread.
- `doc_*` builders: raw v3 documents, and `upd()` to wrap them as RawUpdates.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyfelix.agent.syncer.api import RawUpdate, SyncerCallbacks, SyncStatus, key_of
from pyfelix.confd.bird import BirdResult

API = "projectcalico.org/v3"


class FakeBird:
    def __init__(self, config_path: Path) -> None:
        self.config_path = config_path
        self.running_config: str | None = None
        self.down = False
        self.reject_when: Callable[[str], bool] = lambda text: False
        self.checked: list[str] = []

    def check(self, path: Any) -> BirdResult:
        text = Path(path).read_text()
        self.checked.append(text)
        if self.reject_when(text):
            return BirdResult(False, f"{path}:1:1 syntax error (fake)")
        return BirdResult(True, "")

    def configure(self, socket_path: Any) -> BirdResult:
        if self.down:
            return BirdResult(False, f"Unable to connect to server control socket ({socket_path})")
        self.running_config = self.config_path.read_text()
        return BirdResult(True, "Reading configuration\nReconfigured")


class FakeSyncer:
    def __init__(self) -> None:
        self.callbacks: SyncerCallbacks | None = None
        self.started = False
        self.stopped = False

    def start(self, callbacks: SyncerCallbacks) -> None:
        self.callbacks = callbacks
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    def send(self, *docs: dict[str, Any] | RawUpdate) -> None:
        assert self.callbacks is not None
        self.callbacks.on_updates([d if isinstance(d, RawUpdate) else upd(d) for d in docs])

    def status(self, status: SyncStatus) -> None:
        assert self.callbacks is not None
        self.callbacks.on_status(status)


def upd(doc: dict[str, Any]) -> RawUpdate:
    return RawUpdate(key_of(doc), doc, source="test")


def delete(doc: dict[str, Any]) -> RawUpdate:
    return RawUpdate(key_of(doc), None, source="test")


def _doc(kind: str, name: str, spec: dict[str, Any], labels: dict[str, str] | None = None
         ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": API, "kind": kind, "metadata": meta, "spec": spec}


def doc_node(name: str, ip: str | None, *, as_number: int | None = None,
             cluster_id: str | None = None, labels: dict[str, str] | None = None
             ) -> dict[str, Any]:
    if ip is None:
        return _doc("Node", name, {}, labels)
    bgp: dict[str, Any] = {"ipv4Address": ip}
    if as_number is not None:
        bgp["asNumber"] = as_number
    if cluster_id is not None:
        bgp["routeReflectorClusterID"] = cluster_id
    return _doc("Node", name, {"bgp": bgp}, labels)


def doc_pool(name: str, cidr: str, **spec: Any) -> dict[str, Any]:
    return _doc("IPPool", name, {"cidr": cidr, **spec})


def doc_block(name: str, node: str, cidr: str, state: str = "confirmed") -> dict[str, Any]:
    return _doc("BlockAffinity", name, {"node": node, "cidr": cidr, "state": state})


def doc_peer(name: str, **spec: Any) -> dict[str, Any]:
    return _doc("BGPPeer", name, spec)


def doc_bgp_config(**spec: Any) -> dict[str, Any]:
    return _doc("BGPConfiguration", "default", spec)
