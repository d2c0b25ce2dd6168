"""Status stores: where status records live, per datastore backend.

Role: write an agent's `NodeStatus` / `EndpointStatus` records beside the resources of its
datastore, and read everyone's back (`read()` -> `StatusSnapshot`). `open_status_store(url)`
picks the store for a `--datastore` value:

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
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from agent.status.records import (
    WORKLOAD,
    EndpointStatus,
    NodeStatus,
    StatusRecordError,
    StatusSnapshot,
)

log = logging.getLogger(__name__)

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
    """Status keys in etcd, attached to one lease per agent (see the module docstring)."""

    def __init__(self, config: Any, *, ttl: float = 90.0) -> None:
        import grpc
        from pyetcd import etcdrpc

        from agent.syncer.etcd_conn import EtcdConfig

        assert isinstance(config, EtcdConfig)
        self._rpc = etcdrpc
        self._grpc = grpc
        self._config = config
        self._ttl = max(1, round(ttl))
        self._timeout = config.request_timeout
        self._endpoint_index = 0
        self._channel: Any = None
        self._lease_id = 0
        self._written: dict[str, bytes] = {}  # our keys -> values (re-put on a new lease)
        self.description = config.description

    # --- plumbing ------------------------------------------------------------------------

    def _connect(self) -> None:
        if self._channel is not None:
            return
        endpoint = self._config.endpoints[self._endpoint_index % len(self._config.endpoints)]
        if self._config.tls is not None:
            self._channel = self._grpc.secure_channel(endpoint, self._config.tls.credentials())
        else:
            self._channel = self._grpc.insecure_channel(endpoint)
        self._kv = self._rpc.KVStub(self._channel)
        self._lease = self._rpc.LeaseStub(self._channel)

    def _call(self, what: str, service: str, method: str, request: Any) -> Any:
        """One unary call: `service` is "kv" or "lease", `method` the RPC's name."""
        self._connect()
        fn = getattr(self._kv if service == "kv" else self._lease, method)
        try:
            return fn(request, timeout=self._timeout)
        except self._grpc.RpcError as exc:
            self._reset()
            raise StatusStoreError(f"etcd {what}: {exc.code().name}: {exc.details()}") from exc

    def _reset(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._endpoint_index += 1

    def _grant(self) -> None:
        response = self._call("lease grant", "lease", "LeaseGrant",
                              self._rpc.LeaseGrantRequest(TTL=self._ttl))
        self._lease_id = int(response.ID)
        for key, value in self._written.items():  # a new lease: put every record again
            self._put(key, value)

    def _keep_alive(self) -> None:
        """Refresh the lease; re-grant it (and re-put our keys) if it has expired."""
        if not self._lease_id:
            self._grant()
            return
        response = self._call("lease time-to-live", "lease", "LeaseTimeToLive",
                              self._rpc.LeaseTimeToLiveRequest(ID=self._lease_id))
        if int(response.TTL) <= 0:
            log.warning("status lease %x expired; granting a new one", self._lease_id)
            self._lease_id = 0
            self._grant()
            return
        self._connect()
        call = self._lease.LeaseKeepAlive(
            iter([self._rpc.LeaseKeepAliveRequest(ID=self._lease_id)]), timeout=self._timeout)
        try:
            reply = next(call)
        except (self._grpc.RpcError, StopIteration) as exc:
            self._reset()
            raise StatusStoreError(f"etcd lease keep-alive: {exc}") from exc
        finally:
            call.cancel()  # one refresh per call: do not leave the stream open
        if int(reply.TTL) <= 0:
            self._lease_id = 0
            self._grant()

    def _put(self, key: str, value: bytes) -> None:
        self._call("put", "kv", "Put",
                   self._rpc.PutRequest(key=key.encode(), value=value, lease=self._lease_id))

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
        key = etcd_endpoint_key(hostname, kind, endpoint)
        self._call("delete", "kv", "DeleteRange", self._rpc.DeleteRangeRequest(key=key.encode()))
        self._written.pop(key, None)

    def remove_host(self, hostname: str) -> None:
        """Revoke our lease (etcd deletes every key on it), then delete what is left."""
        if self._lease_id:
            try:
                self._call("lease revoke", "lease", "LeaseRevoke",
                           self._rpc.LeaseRevokeRequest(ID=self._lease_id))
            except StatusStoreError as exc:
                log.warning("revoking the status lease: %s", exc)
            self._lease_id = 0
        from agent.syncer.etcd_conn import prefix_end

        prefix = f"{ETCD_STATUS_ROOT}{_escape(hostname)}/".encode()
        self._call("delete", "kv", "DeleteRange",
                   self._rpc.DeleteRangeRequest(key=prefix, range_end=prefix_end(prefix)))
        self._written.clear()

    def read(self) -> StatusSnapshot:
        from agent.syncer.etcd_conn import prefix_end

        prefix = ETCD_STATUS_ROOT.encode()
        response = self._call("range", "kv", "Range",
                              self._rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix)))
        snapshot = StatusSnapshot([], [], [])
        for kv in response.kvs:
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
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def open_status_store(datastore: str, *, ttl: float = 90.0) -> StatusStore | None:
    """The status store for a --datastore value (None where status is not reported)."""
    from agent.datastore import parse_datastore_url

    location = parse_datastore_url(datastore)
    if location.backend == "file":
        return FileStatusStore(location.path)
    if location.backend == "etcd3":
        from agent.syncer.etcd_conn import EtcdConfig

        return EtcdStatusStore(EtcdConfig.from_options(location.endpoints), ttl=ttl)
    log.info("status reporting is not supported with the %s datastore", location.backend)
    return None
