"""Status stores: where status records live, per datastore backend.

Role: write an agent's `NodeStatus` / `EndpointStatus` records beside the resources of its
datastore, and read everyone's back (`read()` -> `StatusSnapshot`). `open_status_store(location)`
picks the store for a datastore location:

- file datastore (a directory D, or a YAML file F): a hidden directory `D/.status/` (for a
  file: `.F.status/` beside it). The file syncer ignores hidden names, so status writes never
  look like resource changes. Layout: `nodes/<host>.json`, `endpoints/<host>/<id>.json`
  (names %-quoted), each written atomically (temporary file + rename). A file has no TTL of
  its own: readers treat a record older than its `ttl` as expired.
- etcd3: Felix's key layout, `/calico/felix/v2/no-region/host/<host>/status` and
  `.../host/<host>/workload/<orchestrator>/<workload>/endpoint/<endpoint>` (or
  `.../host/<host>/endpoint/<host endpoint>`), names with "/" escaped as `%2f`, JSON values.
  Every key of an agent is attached to ONE lease of `ttl` seconds, kept alive by the periodic
  node write; if the agent dies, etcd deletes them all when the lease runs out; a clean
  stop revokes the lease (deleting them at once). The lease is re-granted (and the records
  re-put) if it expired meanwhile (etcd restarted, the agent paused).
- kubernetes / typha: no status store (Felix does not report status in the Kubernetes
  datastore either); `open_status_store` returns None.

Errors: writes raise `StatusStoreError` (the reporter logs them and retries on its next
tick); unreadable records are listed in `StatusSnapshot.problems`, never fatal.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar
from urllib.parse import quote

from pyfelix.agent.status.records import (
    WORKLOAD,
    EndpointStatus,
    NodeStatus,
    StatusRecordError,
    StatusSnapshot,
)

if TYPE_CHECKING:
    from pyfelix.agent.datastore import DatastoreLocation
    from pyfelix.agent.syncer.etcd_conn import EtcdConfig, EtcdConnection

log = logging.getLogger(__name__)
T = TypeVar("T")

ETCD_STATUS_ROOT = "/calico/felix/v2/no-region/host/"


class StatusStoreError(RuntimeError):
    """A status record could not be written or removed."""


class StatusStore(Protocol):
    description: str

    def write_node(self, status: NodeStatus) -> None: ...

    def write_endpoint(self, status: EndpointStatus) -> None: ...

    def delete_endpoint(self, hostname: str, kind: str, endpoint: str) -> None: ...

    def remove_host(self, hostname: str) -> None: ...

    def read(self) -> StatusSnapshot: ...

    def close(self) -> None: ...


# --- file datastore ------------------------------------------------------------------------


def file_status_dir(datastore_path: str | os.PathLike[str]) -> Path:
    path = Path(datastore_path)
    if path.is_dir():
        return path / ".status"
    return path.parent / f".{path.name}.status"


def _quote(name: str) -> str:
    return quote(name, safe="") or "%00"


class FileStatusStore:
    def __init__(self, datastore_path: str | os.PathLike[str]) -> None:
        self.root = file_status_dir(datastore_path)
        self.description = f"file:{self.root}"

    def _node_path(self, hostname: str) -> Path:
        return self.root / "nodes" / f"{_quote(hostname)}.json"

    def _endpoint_path(self, hostname: str, kind: str, endpoint: str) -> Path:
        return self.root / "endpoints" / _quote(hostname) / f"{kind}.{_quote(endpoint)}.json"

    def _write(self, path: Path, text: str) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            os.replace(tmp, path)
        except OSError as exc:
            raise StatusStoreError(f"writing status {path}: {exc}") from exc

    def write_node(self, status: NodeStatus) -> None:
        self._write(self._node_path(status.hostname), status.to_json())

    def write_endpoint(self, status: EndpointStatus) -> None:
        self._write(self._endpoint_path(status.hostname, status.kind, status.endpoint),
                    status.to_json())

    def delete_endpoint(self, hostname: str, kind: str, endpoint: str) -> None:
        try:
            self._endpoint_path(hostname, kind, endpoint).unlink(missing_ok=True)
        except OSError as exc:
            raise StatusStoreError(f"removing endpoint status {endpoint}: {exc}") from exc

    def remove_host(self, hostname: str) -> None:
        try:
            self._node_path(hostname).unlink(missing_ok=True)
            directory = self.root / "endpoints" / _quote(hostname)
            if directory.is_dir():
                for entry in directory.iterdir():
                    entry.unlink(missing_ok=True)
                directory.rmdir()
        except OSError as exc:
            raise StatusStoreError(f"removing status of {hostname}: {exc}") from exc

    def read(self) -> StatusSnapshot:
        snapshot = StatusSnapshot([], [], [])
        for path in sorted((self.root / "nodes").glob("*.json")):
            try:
                snapshot.nodes.append(NodeStatus.from_json(path.read_text(), str(path)))
            except (OSError, StatusRecordError) as exc:
                snapshot.problems.append(str(exc))
        for path in sorted((self.root / "endpoints").glob("*/*.json")):
            try:
                snapshot.endpoints.append(EndpointStatus.from_json(path.read_text(), str(path)))
            except (OSError, StatusRecordError) as exc:
                snapshot.problems.append(str(exc))
        return snapshot

    def close(self) -> None:
        return None


# --- etcd ----------------------------------------------------------------------------------


def _escape(name: str) -> str:
    return name.replace("%", "%25").replace("/", "%2f")


def etcd_node_key(hostname: str) -> str:
    return f"{ETCD_STATUS_ROOT}{_escape(hostname)}/status"


def etcd_endpoint_key(hostname: str, kind: str, endpoint: str) -> str:
    if kind == WORKLOAD:
        orchestrator, _, rest = endpoint.partition("/")
        workload, _, ep = rest.rpartition("/")
        return (f"{ETCD_STATUS_ROOT}{_escape(hostname)}/workload/{_escape(orchestrator)}/"
                f"{_escape(workload)}/endpoint/{_escape(ep)}")
    return f"{ETCD_STATUS_ROOT}{_escape(hostname)}/endpoint/{_escape(endpoint)}"


class EtcdStatusStore:
    """Status keys in etcd, attached to one lease per agent (see the module docstring).

    Talks to etcd through the syncer's own connection class (`EtcdConnection`, TLS and
    message limits included), one endpoint at a time: a failed call closes the connection
    and the next call tries the next endpoint."""

    def __init__(self, config: EtcdConfig, *, ttl: float = 90.0) -> None:
        # imported here: gRPC is loaded only by an agent that reports status into etcd
        from pyfelix.agent.syncer.etcd_conn import EndpointRotation, EtcdError

        self._failure = EtcdError
        self._endpoints = EndpointRotation(config)
        self._ttl = max(1, round(ttl))
        self._connection: EtcdConnection | None = None
        self._lease_id = 0
        self._written: dict[str, bytes] = {}  # our keys -> values (re-put on a new lease)
        self.description = config.description

    # --- plumbing ------------------------------------------------------------------------

    def _call(self, operation: Callable[[EtcdConnection], T]) -> T:
        """Run one operation on the current endpoint; on failure move to the next one and
        raise StatusStoreError (the reporter logs it and retries on its next tick)."""
        if self._connection is None:
            self._connection = self._endpoints.connect()
        try:
            return operation(self._connection)
        except self._failure as exc:
            self._connection.close()
            self._connection = None
            self._endpoints.advance()
            raise StatusStoreError(str(exc)) from exc

    def _grant(self) -> None:
        self._lease_id = self._call(lambda conn: conn.lease_grant(self._ttl))
        for key, value in self._written.items():  # a new lease: put every record again
            self._put(key, value)

    def _keep_alive(self) -> None:
        """Refresh the lease; re-grant it (and re-put our keys) if it has expired."""
        if not self._lease_id:
            self._grant()
            return
        lease = self._lease_id
        if self._call(lambda conn: conn.lease_time_to_live(lease)) <= 0:
            log.warning("status lease %x expired; granting a new one", lease)
            self._lease_id = 0
            self._grant()
            return
        if self._call(lambda conn: conn.lease_keep_alive(lease)) <= 0:
            self._lease_id = 0
            self._grant()

    def _put(self, key: str, value: bytes) -> None:
        lease = self._lease_id
        self._call(lambda conn: conn.put(key.encode(), value, lease=lease))

    # --- the StatusStore protocol ----------------------------------------------------------

    def write_node(self, status: NodeStatus) -> None:
        self._keep_alive()
        key, value = etcd_node_key(status.hostname), status.to_json().encode()
        self._put(key, value)
        self._written[key] = value

    def write_endpoint(self, status: EndpointStatus) -> None:
        if not self._lease_id:
            self._grant()
        key = etcd_endpoint_key(status.hostname, status.kind, status.endpoint)
        value = status.to_json().encode()
        self._put(key, value)
        self._written[key] = value

    def delete_endpoint(self, hostname: str, kind: str, endpoint: str) -> None:
        key = etcd_endpoint_key(hostname, kind, endpoint).encode()
        self._call(lambda conn: conn.delete(key))
        self._written.pop(key.decode(), None)

    def remove_host(self, hostname: str) -> None:
        """Revoke our lease (etcd deletes every key on it), then delete what is left."""
        if self._lease_id:
            lease = self._lease_id
            try:
                self._call(lambda conn: conn.lease_revoke(lease))
            except StatusStoreError as exc:
                log.warning("revoking the status lease: %s", exc)
            self._lease_id = 0
        prefix = f"{ETCD_STATUS_ROOT}{_escape(hostname)}/".encode()
        self._call(lambda conn: conn.delete_prefix(prefix))
        self._written.clear()

    def read(self) -> StatusSnapshot:
        prefix = ETCD_STATUS_ROOT.encode()
        pages = self._call(lambda conn: [kvs for _, kvs in conn.range_pages(prefix)])
        snapshot = StatusSnapshot([], [], [])
        for kv in (kv for page in pages for kv in page):
            key = kv.key.decode(errors="replace")
            try:
                if key.endswith("/status"):
                    snapshot.nodes.append(NodeStatus.from_json(kv.value, key))
                else:
                    snapshot.endpoints.append(EndpointStatus.from_json(kv.value, key))
            except StatusRecordError as exc:
                snapshot.problems.append(str(exc))
        return snapshot

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def open_status_store(location: DatastoreLocation, *,
                      ttl: float = 90.0) -> StatusStore | None:
    """The status store beside the datastore at `location` (None where status is not
    reported)."""
    if location.backend == "file":
        return FileStatusStore(location.path)
    if location.backend == "etcd3":
        from pyfelix.agent.syncer.etcd_conn import EtcdConfig

        return EtcdStatusStore(EtcdConfig.from_options(location.endpoints), ttl=ttl)
    log.info("status reporting is not supported with the %s datastore", location.backend)
    return None
