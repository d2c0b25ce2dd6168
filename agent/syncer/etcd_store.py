"""The etcd3 datastore client behind `pyfelix apply/delete/get --datastore etcd3://...`.

Role: implements `agent.syncer.client.Datastore` on Calico's v3 key layout
(`agent.syncer.etcd_keys`), so a running `EtcdSyncer` sees exactly what was applied.

Inputs: documents (dicts) and keys. Outputs: etcd keys holding each document as JSON;
documents read back, sorted by key.

Invariants:
- `apply` checks every document (keyable, the injectable `validate` hook, a kind with an
  etcd layout, a name usable in a key, no key twice) before the first write; any problem
  raises `InvalidResources` listing all of them and nothing is written;
- documents equal to what is stored are not written again ("unchanged");
- writes go in transactions of up to `TXN_CHUNK` resources, each guarded by the mod
  revisions read just before (optimistic concurrency): a resource changed by someone else
  in between makes the chunk retry from the read, so no concurrent edit is overwritten
  unseen. An apply of more than `TXN_CHUNK` resources is not one transaction;
- each request tries the endpoints in turn; when none answers the error
  (`DatastoreUnavailable`) names them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pyfelix.agent.syncer.api import DatastoreError, ResourceKey
from pyfelix.agent.syncer.client import (
    ApplyResult,
    DatastoreClientError,
    DatastoreUnavailable,
    ResourceNotFound,
    Validator,
    minimal_validate,
)
from pyfelix.agent.syncer.etcd_conn import (
    EndpointRotation,
    EtcdConfig,
    EtcdConnection,
    EtcdError,
    EtcdUnavailable,
)
from pyfelix.agent.syncer.etcd_keys import (
    ETCD_ROOT,
    EtcdKeyError,
    decode_value,
    encode_value,
    etcd_key,
    kind_prefix,
    parse_etcd_key,
)
from pyfelix.agent.syncer.write_checks import checked_documents

TXN_CHUNK = 100  # etcd's default --max-txn-ops is 128
CONFLICT_RETRIES = 3
T = TypeVar("T")


def _check_storable(key: ResourceKey, doc: Mapping[str, Any]) -> None:
    try:
        etcd_key(key)
    except EtcdKeyError as exc:
        raise ValueError(str(exc)) from None


class EtcdDatastore:
    """Read/write access to resources in etcd (see module docstring)."""

    def __init__(self, config: EtcdConfig, *, validate: Validator = minimal_validate,
                 page_size: int = 1000) -> None:
        self.config = config
        self._validate = validate
        self._page_size = page_size
        self._endpoints = EndpointRotation(config)
        self._connection: EtcdConnection | None = None
        self._warnings: list[DatastoreError] = []

    @property
    def description(self) -> str:
        return f"etcd3 datastore {self.config.description}"

    @property
    def warnings(self) -> list[DatastoreError]:
        return list(self._warnings)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # -- transport with failover --

    def _call(self, operation: Callable[[EtcdConnection], T]) -> T:
        failures: list[str] = []
        for _ in self.config.endpoints:
            if self._connection is None:
                self._connection = self._endpoints.connect()
            try:
                return operation(self._connection)
            except EtcdUnavailable as exc:
                failures.append(str(exc))
                self.close()
                self._endpoints.advance()
            except EtcdError as exc:
                raise DatastoreClientError(str(exc)) from exc
        raise DatastoreUnavailable(
            f"cannot reach etcd at {', '.join(self.config.endpoints)}: " + "; ".join(failures))

    # -- reads --

    def _read_prefix(self, prefix: str) -> dict[ResourceKey, dict[str, Any]]:
        def read(connection: EtcdConnection) -> list[Any]:
            return [kv for _, kvs in connection.range_pages(prefix.encode(),
                                                           page_size=self._page_size)
                    for kv in kvs]

        found: dict[ResourceKey, dict[str, Any]] = {}
        self._warnings = []
        for kv in self._call(read):
            path = kv.key.decode("utf-8", "replace")
            try:
                key = parse_etcd_key(path)
                if key is None:
                    continue
                found[key] = decode_value(path, key, kv.value)
            except ValueError as exc:
                self._warnings.append(DatastoreError(path, f"{exc}; skipped"))
        return found

    def list(self) -> dict[ResourceKey, dict[str, Any]]:
        return self._read_prefix(ETCD_ROOT)

    def get(self, kind: str, name: str | None = None,
            namespace: str | None = None) -> list[dict[str, Any]]:
        try:
            prefix = kind_prefix(kind, namespace)
        except EtcdKeyError as exc:
            raise DatastoreClientError(str(exc)) from exc
        found = self._read_prefix(prefix)
        return [doc for key, doc in sorted(found.items())
                if key.kind == kind and (name is None or key.name == name)
                and (namespace is None or key.namespace == namespace)]

    # -- writes --

    def apply(self, docs: Sequence[Mapping[str, Any]], *,
              sources: Sequence[str] | None = None) -> list[ApplyResult]:
        keyed = checked_documents(docs, sources, self._validate, _check_storable)
        results: list[ApplyResult] = []
        for start in range(0, len(keyed), TXN_CHUNK):
            results.extend(self._apply_chunk(keyed[start:start + TXN_CHUNK]))
        return results

    def _apply_chunk(self, chunk: list[tuple[ResourceKey, dict[str, Any]]]
                     ) -> list[ApplyResult]:
        for _ in range(CONFLICT_RETRIES):
            results, writes = self._plan_chunk(chunk)
            if not writes or self._call(lambda c, w=writes: c.put_if_unchanged(w)):
                return results
        names = ", ".join(str(key) for key, _ in chunk)
        raise DatastoreClientError(
            f"resources changed in etcd while applying them ({CONFLICT_RETRIES} attempts): "
            f"{names}")

    def _plan_chunk(self, chunk: list[tuple[ResourceKey, dict[str, Any]]]
                    ) -> tuple[list[ApplyResult], list[tuple[bytes, bytes, int]]]:
        results: list[ApplyResult] = []
        writes: list[tuple[bytes, bytes, int]] = []
        for key, doc in chunk:
            path = etcd_key(key)
            stored = self._call(lambda c, p=path: c.get(p.encode()))
            if stored is None:
                results.append(ApplyResult(key, "created"))
                writes.append((path.encode(), encode_value(doc), 0))
                continue
            try:
                unchanged = decode_value(path, key, stored.value) == doc
            except ValueError:
                unchanged = False  # replace an unreadable value
            if unchanged:
                results.append(ApplyResult(key, "unchanged"))
                continue
            results.append(ApplyResult(key, "configured"))
            writes.append((path.encode(), encode_value(doc), int(stored.mod_revision)))
        return results, writes

    def delete(self, key: ResourceKey) -> None:
        try:
            path = etcd_key(key)
        except EtcdKeyError as exc:
            raise DatastoreClientError(str(exc)) from exc
        if not self._call(lambda c: c.delete(path.encode())):
            raise ResourceNotFound(f"{key} not found in {self.description}")


def open_etcd_datastore(endpoints: Sequence[str], *, validate: Validator = minimal_validate,
                        ca_cert: str | None = None, cert_file: str | None = None,
                        key_file: str | None = None,
                        request_timeout: float = 5.0) -> EtcdDatastore:
    """The client for `--datastore etcd3://HOST:PORT[,...]`; TLS as `make_etcd_syncer`."""
    config = EtcdConfig.from_options(endpoints, ca_cert=ca_cert, cert_file=cert_file,
                                     key_file=key_file, request_timeout=request_timeout)
    return EtcdDatastore(config, validate=validate)
