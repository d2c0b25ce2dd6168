"""A small etcd v3 connection: one gRPC channel to one endpoint, plus endpoint rotation.

Role: the transport under the etcd syncer and the etcd client. It speaks etcd's gRPC API
through the generated stubs of `pyetcd` (PyPI `etcd-sdk-python`, the maintained fork of
python-etcd3), but owns its channels instead of using `pyetcd.client`: that client marks a
failed endpoint unusable for 300 s and keeps gRPC's own reconnect backoff (up to 120 s),
while a syncer must retry on ITS schedule and see a restarted etcd within a second.

Inputs: an `EtcdConfig` (endpoints `host:port`, optional TLS files, request timeout).
Outputs: range pages (`kv_pb2.KeyValue`s at one revision), puts/deletes/transactions, and
`WatchStream`s that deliver raw `WatchResponse`s.

Errors are translated once, here: `EtcdCompacted` (a revision older than the last
compaction), `EtcdUnavailable` (the endpoint cannot be reached or stopped answering:
UNAVAILABLE, DEADLINE_EXCEEDED, a broken stream...), `EtcdRequestError` (etcd answered
but refused: permission denied, bad request...).

Invariants: every unary call has a deadline (`request_timeout`), so a stopped etcd
(SIGSTOP, a partition) fails the call instead of hanging; a range listed in pages reads
every page at the revision of the first one, so the pages form one snapshot; a watch is
created with etcd's require-leader metadata, so a cluster member that loses its quorum
(partitioned from its peers, yet running and answering) ends the stream with
`EtcdUnavailable` after a few election timeouts instead of keeping it silently idle.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from pyetcd import etcdrpc

from pyfelix.agent.syncer.client import DatastoreURLError

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
# etcd's own error text for a revision below the compaction point (OUT_OF_RANGE).
_COMPACTED_CODES = (grpc.StatusCode.OUT_OF_RANGE,)
_UNAVAILABLE_CODES = (
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
)

# etcd's "require leader" stream metadata (clientv3.WithRequireLeader): the member refuses
# the watch while it has no leader and cancels it (UNAVAILABLE "no leader") once it has had
# none for a few election timeouts, so a member cut off from its quorum cannot hold a watch
# that will never see another write (it still answers progress requests by itself).
_REQUIRE_LEADER = (("hasleader", "true"),)

# Environment variables Calico uses for the same settings.
ENV_CA_CERT = "ETCD_CA_CERT_FILE"
ENV_CERT = "ETCD_CERT_FILE"
ENV_KEY = "ETCD_KEY_FILE"


class EtcdError(Exception):
    """Base of the errors this module raises."""


class EtcdUnavailable(EtcdError):
    """The endpoint could not be reached, timed out, or its stream broke."""


class EtcdRequestError(EtcdError):
    """etcd answered and refused the request (auth, permissions, invalid request)."""


class EtcdCompacted(EtcdError):
    """The requested revision is older than etcd's last compaction."""

    def __init__(self, message: str, compact_revision: int = 0) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


@dataclass(frozen=True)
class EtcdTLS:
    ca_cert: str
    cert_file: str | None = None
    key_file: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as handle:
                return handle.read()

        return grpc.ssl_channel_credentials(read(self.ca_cert), read(self.key_file),
                                            read(self.cert_file))


@dataclass(frozen=True)
class EtcdConfig:
    endpoints: tuple[str, ...]
    tls: EtcdTLS | None = None
    request_timeout: float = 5.0

    @property
    def description(self) -> str:
        scheme = "etcd3+tls" if self.tls else "etcd3"
        return f"{scheme}://{','.join(self.endpoints)}"

    @classmethod
    def from_options(cls, endpoints: Sequence[str], *, ca_cert: str | None = None,
                     cert_file: str | None = None, key_file: str | None = None,
                     request_timeout: float = 5.0,
                     environ: Mapping[str, str] | None = None) -> EtcdConfig:
        """Build a config from endpoints and TLS file options (falling back to Calico's
        ETCD_CA_CERT_FILE / ETCD_CERT_FILE / ETCD_KEY_FILE); raises DatastoreURLError naming
        the bad option."""
        env = os.environ if environ is None else environ
        ca_cert = ca_cert or env.get(ENV_CA_CERT) or None
        cert_file = cert_file or env.get(ENV_CERT) or None
        key_file = key_file or env.get(ENV_KEY) or None
        if not endpoints:
            raise DatastoreURLError("etcd datastore: no endpoint (expected HOST:PORT)")
        for endpoint in endpoints:
            host, sep, port = endpoint.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise DatastoreURLError(f"etcd endpoint {endpoint!r} is not HOST:PORT")
        if (cert_file is None) != (key_file is None):
            raise DatastoreURLError(
                "etcd TLS: a client certificate (cert_file / ETCD_CERT_FILE) and its key "
                "(key_file / ETCD_KEY_FILE) must be given together")
        if cert_file is not None and ca_cert is None:
            raise DatastoreURLError(
                "etcd TLS: a client certificate needs the CA (ca_cert / ETCD_CA_CERT_FILE)")
        for option, path in (("ca_cert", ca_cert), ("cert_file", cert_file),
                             ("key_file", key_file)):
            if path is not None and not os.path.isfile(path):
                raise DatastoreURLError(f"etcd TLS: {option} {path!r} is not a readable file")
        tls = EtcdTLS(ca_cert, cert_file, key_file) if ca_cert else None
        return cls(tuple(endpoints), tls, request_timeout)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix` (etcd's range_end)."""
    trimmed = bytearray(prefix)
    while trimmed:
        if trimmed[-1] < 0xFF:
            trimmed[-1] += 1
            return bytes(trimmed)
        trimmed.pop()
    return b"\0"  # every key


def _translate(endpoint: str, what: str, exc: grpc.RpcError) -> EtcdError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    message = f"etcd {endpoint}: {what} failed: {getattr(code, 'name', code)}: {details}"
    if code in _COMPACTED_CODES:
        return EtcdCompacted(message)
    if code in _UNAVAILABLE_CODES or code is None:
        return EtcdUnavailable(message)
    return EtcdRequestError(message)


class WatchStream:
    """One gRPC Watch stream carrying one watcher over a key range.

    A reader thread pumps responses into a queue, so `receive(timeout)` can wait with a
    deadline (the liveness check of the syncer) on a blocking gRPC iterator.
    """

    _END = object()

    def __init__(self, stub: Any, endpoint: str, key: bytes, range_end: bytes,
                 start_revision: int) -> None:
        self.endpoint = endpoint
        self._requests: queue.Queue[Any] = queue.Queue()
        self._responses: queue.Queue[Any] = queue.Queue()
        create = etcdrpc.WatchCreateRequest(key=key, range_end=range_end,
                                            start_revision=start_revision)
        self._requests.put(etcdrpc.WatchRequest(create_request=create))
        self._call = stub.Watch(self._request_iterator(), metadata=_REQUIRE_LEADER)
        self._reader = threading.Thread(target=self._read, name=f"etcd-watch-{endpoint}",
                                        daemon=True)
        self._reader.start()

    def _request_iterator(self) -> Iterator[Any]:
        while True:
            request = self._requests.get()
            if request is None:
                return
            yield request

    def _read(self) -> None:
        try:
            for response in self._call:
                self._responses.put(response)
        except grpc.RpcError as exc:
            self._responses.put(exc)
        finally:
            self._responses.put(self._END)

    def receive(self, timeout: float) -> Any | None:
        """The next WatchResponse, or None after `timeout` seconds without one.

        Raises EtcdUnavailable once the stream has broken or ended.
        """
        try:
            item = self._responses.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is self._END or isinstance(item, grpc.RpcError):
            self._responses.put(self._END)  # every later call fails the same way
            if isinstance(item, grpc.RpcError):
                raise _translate(self.endpoint, "watch", item)
            raise EtcdUnavailable(f"etcd {self.endpoint}: the watch stream ended")
        return item

    def request_progress(self) -> None:
        """Ask etcd for a progress response (used as a liveness probe)."""
        self._requests.put(etcdrpc.WatchRequest(
            progress_request=etcdrpc.WatchProgressRequest()))

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._reader.join(timeout=5.0)


class EtcdConnection:
    """One channel to one endpoint. Create a new one to reconnect (fresh gRPC state)."""

    def __init__(self, endpoint: str, config: EtcdConfig) -> None:
        self.endpoint = endpoint
        self.timeout = config.request_timeout
        if config.tls is not None:
            self._channel = grpc.secure_channel(endpoint, config.tls.credentials(),
                                                options=_GRPC_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(endpoint, options=_GRPC_OPTIONS)
        self._kv = etcdrpc.KVStub(self._channel)
        self._watch = etcdrpc.WatchStub(self._channel)
        self._lease = etcdrpc.LeaseStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _unary(self, what: str, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise _translate(self.endpoint, what, exc) from None

    def range_pages(self, prefix: bytes, *, revision: int = 0, page_size: int = 1000,
                    keys_only: bool = False) -> Iterator[tuple[int, list[Any]]]:
        """Every key under `prefix`, in key order, in pages of `page_size`, all read at one
        revision (`revision`, or the current one when 0). Yields (revision, kvs)."""
        end = prefix_end(prefix)
        start = prefix
        while True:
            request = etcdrpc.RangeRequest(key=start, range_end=end, limit=page_size,
                                           revision=revision, keys_only=keys_only)
            response = self._unary("range", self._kv.Range, request)
            revision = revision or response.header.revision
            kvs = list(response.kvs)
            yield revision, kvs
            if not response.more or not kvs:
                return
            start = kvs[-1].key + b"\0"

    def get(self, key: bytes) -> Any | None:
        """The KeyValue at `key` (current revision), or None."""
        response = self._unary("get", self._kv.Range, etcdrpc.RangeRequest(key=key))
        return response.kvs[0] if response.kvs else None

    def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Put one key (attached to `lease` when not 0); returns the new revision."""
        response = self._unary("put", self._kv.Put,
                               etcdrpc.PutRequest(key=key, value=value, lease=lease))
        return int(response.header.revision)

    def delete_prefix(self, prefix: bytes) -> int:
        """Delete every key under `prefix`; returns how many were deleted."""
        response = self._unary("delete", self._kv.DeleteRange,
                               etcdrpc.DeleteRangeRequest(key=prefix,
                                                          range_end=prefix_end(prefix)))
        return int(response.deleted)

    # --- leases (the status store's keys live on one) -------------------------------------

    def lease_grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; returns its id."""
        response = self._unary("lease grant", self._lease.LeaseGrant,
                               etcdrpc.LeaseGrantRequest(TTL=ttl))
        return int(response.ID)

    def lease_time_to_live(self, lease: int) -> int:
        """Seconds left on `lease` (<= 0 once it has expired)."""
        response = self._unary("lease time-to-live", self._lease.LeaseTimeToLive,
                               etcdrpc.LeaseTimeToLiveRequest(ID=lease))
        return int(response.TTL)

    def lease_keep_alive(self, lease: int) -> int:
        """Refresh `lease` once (one request on a keep-alive stream, then the stream is
        cancelled); returns its new TTL (<= 0 if it had expired)."""
        call = self._lease.LeaseKeepAlive(iter([etcdrpc.LeaseKeepAliveRequest(ID=lease)]),
                                          timeout=self.timeout)
        try:
            return int(next(call).TTL)
        except grpc.RpcError as exc:
            raise _translate(self.endpoint, "lease keep-alive", exc) from None
        except StopIteration:
            raise EtcdUnavailable(f"etcd {self.endpoint}: lease keep-alive: the stream "
                                  "ended without an answer") from None
        finally:
            call.cancel()

    def lease_revoke(self, lease: int) -> None:
        """Revoke `lease`: etcd deletes every key attached to it."""
        self._unary("lease revoke", self._lease.LeaseRevoke,
                    etcdrpc.LeaseRevokeRequest(ID=lease))

    def delete(self, key: bytes) -> int:
        """Delete one key; returns how many keys were deleted (0 or 1)."""
        response = self._unary("delete", self._kv.DeleteRange,
                               etcdrpc.DeleteRangeRequest(key=key))
        return int(response.deleted)

    def put_if_unchanged(self, writes: Sequence[tuple[bytes, bytes, int]]) -> bool:
        """Put every (key, value) in one transaction, only if each key's mod revision is
        still the given one (0: the key must not exist). Returns False if any changed."""
        compares = [etcdrpc.Compare(key=key, target=etcdrpc.Compare.MOD,
                                    result=etcdrpc.Compare.EQUAL, mod_revision=mod_revision)
                    for key, _, mod_revision in writes]
        success = [etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=value))
                   for key, value, _ in writes]
        response = self._unary("transaction", self._kv.Txn,
                               etcdrpc.TxnRequest(compare=compares, success=success))
        return bool(response.succeeded)

    def watch(self, prefix: bytes, start_revision: int) -> WatchStream:
        return WatchStream(self._watch, self.endpoint, prefix, prefix_end(prefix),
                           start_revision)


class EndpointRotation:
    """The endpoints of a config, tried in turn: `connect()` opens the current one,
    `advance()` moves to the next after a failure."""

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        self._index = 0

    @property
    def current(self) -> str:
        return self.config.endpoints[self._index]

    def connect(self) -> EtcdConnection:
        return EtcdConnection(self.current, self.config)

    def advance(self) -> None:
        self._index = (self._index + 1) % len(self.config.endpoints)
