"""The backend factories: a `--datastore` value -> a `DatastoreLocation` -> a client or a syncer.

Role: the one place that knows every backend. `parse_datastore_url()` turns a `--datastore`
value into a `DatastoreLocation`:
- a directory or a YAML/JSON file (optionally `file://PATH`) -> the file backend;
- `etcd3://HOST:PORT[,HOST:PORT...]` -> etcd v3;
- `kubernetes` (or `kubernetes://`) -> the Kubernetes API (in-cluster or KUBECONFIG);
- `typha://HOST:PORT[,...]` (or `typha://` to discover it) -> Typha's fan-out (read-only).
`open_datastore()` gives the read/write client of `pyfelix apply/delete/get`
(`agent.syncer.client.Datastore`), `make_syncer()` the list+watch syncer of the agent,
confd and Typha itself.

Layering: this module sits above the backends (`agent.syncer.*`) AND Typha's client
(`agent.typha`), which itself only uses the syncer vocabulary (`agent.syncer.api`,
`agent.syncer.client`); so no backend imports another, and nothing below imports this.
Errors are the `DatastoreClientError` family of `agent.syncer.client`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pyfelix.agent.syncer.api import Syncer
from pyfelix.agent.syncer.client import (
    BackendNotImplemented,
    Datastore,
    DatastoreURLError,
    Validator,
    minimal_validate,
)


@dataclass(frozen=True)
class DatastoreLocation:
    """Where a datastore is: parsed once at the edge (the CLI's --datastore option, a test,
    a tool that made the datastore) and passed down; nothing below parses a URL again."""

    backend: str  # "file", "etcd3", "kubernetes" or "typha"
    path: str = ""  # file backend
    endpoints: tuple[str, ...] = ()  # etcd3 / typha: "host:port"

    def __str__(self) -> str:
        """The --datastore value that names this location (for messages, logs and the
        command lines of processes started with it)."""
        if self.backend == "file":
            return self.path
        if self.backend == "kubernetes":
            return "kubernetes"
        return f"{self.backend}://{','.join(self.endpoints)}"

    @classmethod
    def file(cls, path: str | os.PathLike[str]) -> DatastoreLocation:
        """The file datastore at `path` (a tool or test that made the directory itself)."""
        return cls("file", path=os.fspath(path))


_URL_FORMS = ("a directory, a YAML file, etcd3://HOST:PORT[,HOST:PORT...], kubernetes, "
              "or typha://HOST:PORT[,...]")


def _endpoints(url: str, rest: str) -> tuple[str, ...]:
    endpoints = tuple(part.strip() for part in rest.split(",") if part.strip())
    if not endpoints:
        raise DatastoreURLError(f"--datastore {url!r} names no HOST:PORT")
    for endpoint in endpoints:
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise DatastoreURLError(
                f"--datastore {url!r}: {endpoint!r} is not HOST:PORT (port 1-65535)")
    return endpoints


def parse_datastore_url(url: str) -> DatastoreLocation:
    """Parse a --datastore value; raises DatastoreURLError naming the accepted forms."""
    text = url.strip()
    if not text:
        raise DatastoreURLError(f"--datastore is empty; expected {_URL_FORMS}")
    if text in ("kubernetes", "kubernetes://"):
        return DatastoreLocation("kubernetes")
    scheme, sep, rest = text.partition("://")
    if not sep:
        return DatastoreLocation("file", path=text)
    scheme = scheme.lower()
    if scheme == "file":
        if not rest:
            raise DatastoreURLError(f"--datastore {url!r} names no path")
        return DatastoreLocation("file", path=rest)
    if scheme == "typha" and not rest.strip():
        # no address: discovered from FELIX_TYPHAADDR or the FELIX_TYPHAK8SSERVICENAME service
        return DatastoreLocation("typha")
    if scheme in ("etcd3", "typha"):
        return DatastoreLocation(scheme, endpoints=_endpoints(url, rest))
    raise DatastoreURLError(f"--datastore {url!r}: unknown scheme {scheme!r}; expected "
                            f"{_URL_FORMS}")


def _not_implemented(location: DatastoreLocation) -> BackendNotImplemented:
    return BackendNotImplemented(
        f"the {location.backend} datastore is not implemented yet; use a directory or YAML "
        "file datastore (--datastore ./resources)")


def open_datastore(location: DatastoreLocation, *,
                   validate: Validator | None = None) -> Datastore:
    """A client for the datastore at `location`."""
    if location.backend == "file":
        from pyfelix.agent.syncer.file_store import FileDatastore

        return FileDatastore(location.path, validate=validate or minimal_validate)
    if location.backend == "etcd3":
        from pyfelix.agent.syncer.etcd_store import open_etcd_datastore

        return open_etcd_datastore(location.endpoints, validate=validate or minimal_validate)
    if location.backend == "kubernetes":
        from pyfelix.agent.syncer.kube_store import open_kube_datastore

        return open_kube_datastore(validate=validate or minimal_validate)
    if location.backend == "typha":
        raise DatastoreURLError(
            f"--datastore {str(location)!r}: Typha only fans out the datastore's watch "
            "(read-only); apply, delete and get need the datastore itself")
    raise _not_implemented(location)


def make_syncer(location: DatastoreLocation, *, syncer_type: str = "felix",
                hostname: str = "", **options: Any) -> Syncer:
    """The syncer for the datastore at `location`; `options` go to the backend's constructor
    (file backend: poll_interval, debounce, use_inotify, rescan_interval...).

    `syncer_type` ("felix": the agent's kinds; "bgp": what confd needs) and `hostname`
    matter to Typha, which serves one filtered stream per syncer type, and to the Kubernetes
    datastore, which reads Secrets (BGP passwords, one namespace) only for "bgp"; the file
    and etcd syncers carry every kind and their consumer picks what it needs (the agent's
    validator drops Secrets unparsed)."""
    if location.backend == "typha":
        from pyfelix.agent.typha.client import TyphaConfigError, make_typha_syncer

        try:
            return make_typha_syncer(location.endpoints, syncer_type=syncer_type,
                                     hostname=hostname, **options)
        except TyphaConfigError as exc:
            raise DatastoreURLError(str(exc)) from None
    if location.backend == "file":
        from pyfelix.agent.syncer.file import FileSyncer

        return FileSyncer(os.path.normpath(location.path), **options)
    if location.backend == "etcd3":
        from pyfelix.agent.syncer.etcd import make_etcd_syncer

        return make_etcd_syncer(location.endpoints, **options)
    if location.backend == "kubernetes":
        from pyfelix.agent.syncer.kube import make_kube_syncer

        return make_kube_syncer(syncer_type=syncer_type, **options)
    raise _not_implemented(location)
