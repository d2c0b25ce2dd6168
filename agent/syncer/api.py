"""The syncer interface: what every datastore backend (file, etcd3, kubernetes, typha) emits.

Role: turn a datastore into an ordered stream of `RawUpdate`s keyed by `ResourceKey`, plus a
status that goes WAIT_FOR_DATASTORE -> RESYNC -> IN_SYNC (and back to RESYNC while a backend
relists after losing its watch).

Outputs go to a `SyncerCallbacks` object, called from the syncer's own thread:
- `on_status(status)`;
- `on_updates([RawUpdate, ...])`: `value` is the whole document as a dict (apiVersion, kind,
  metadata, spec...), or None for a delete. Documents are NOT validated here: the validator
  stage (`agent.validator`) turns them into typed model objects, and a bad one into a delete;
- `on_error(DatastoreError)`: input the syncer could not even key (a YAML file that fails to
  parse, a document without kind/name). The syncer keeps the last good state for that source.

Invariants: a key's updates arrive in datastore order; after IN_SYNC every key that exists
has been sent; a relist sends deletes for keys that vanished while the watch was lost.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from pyfelix.agent.kinds import KIND_K8S_NETWORK_POLICY, NAMESPACED_KINDS


class SyncStatus(enum.Enum):
    WAIT_FOR_DATASTORE = "wait-for-datastore"
    RESYNC = "resync"
    IN_SYNC = "in-sync"


@dataclass(frozen=True, order=True, slots=True)
class ResourceKey:
    """kind (Calico's or Kubernetes' kind name), namespace ("" for cluster-scoped), name."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        if self.namespace:
            return f"{self.kind}({self.namespace}/{self.name})"
        return f"{self.kind}({self.name})"


@dataclass(frozen=True, slots=True)
class RawUpdate:
    key: ResourceKey
    value: dict[str, Any] | None
    source: str = ""  # where it came from, for error messages: "path.yaml#2", an etcd key...
    revision: str = ""


@dataclass(frozen=True, slots=True)
class DatastoreError:
    source: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.message}"


class SyncerCallbacks(Protocol):
    def on_status(self, status: SyncStatus) -> None: ...

    def on_updates(self, updates: list[RawUpdate]) -> None: ...

    def on_error(self, error: DatastoreError) -> None: ...


class Syncer(Protocol):
    def start(self, callbacks: SyncerCallbacks) -> None:
        """Start the syncer's thread; returns at once."""

    def stop(self) -> None:
        """Stop and join the thread; idempotent."""


def key_of(doc: Any) -> ResourceKey:
    """The key of a raw document; raises ValueError naming the missing field."""
    if not isinstance(doc, dict):
        raise ValueError(f"document is a {type(doc).__name__}, not a mapping")
    kind = doc.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ValueError("field 'kind' is missing or not a string")
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        raise ValueError(f"{kind}: field 'metadata' is missing or not a mapping")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind}: field 'metadata.name' is missing or not a string")
    namespace = meta.get("namespace") or ""
    if not isinstance(namespace, str):
        raise ValueError(f"{kind}({name}): field 'metadata.namespace' is not a string")
    api_version = doc.get("apiVersion")
    if (kind == "NetworkPolicy" and isinstance(api_version, str)
            and api_version.startswith("networking.k8s.io")):
        kind = KIND_K8S_NETWORK_POLICY
    # a namespaced kind's document without a namespace is in "default", as calicoctl and
    # kubectl place it
    namespace = (namespace or "default") if kind in NAMESPACED_KINDS else ""
    # kinds and namespaces repeat across many keys: one string object each (sys.intern;
    # an interned string is freed with its last user)
    return ResourceKey(sys.intern(kind), sys.intern(namespace), name)
