"""Datastore clients for `pyfelix apply/delete/get`, and the backend factories.

Role: one small read/write interface (`Datastore`) that every backend implements, so the
CLI commands hold no backend logic; `open_datastore(url)` and `make_syncer(url)` pick the
backend from a `--datastore` value (docs/ARCHITECTURE.md section 2):
- a directory or a YAML/JSON file (optionally `file://PATH`) -> the file backend;
- `etcd3://HOST:PORT[,HOST:PORT...]`, `kubernetes` (or `kubernetes://`),
  `typha://HOST:PORT[,...]` -> recognised, but not implemented yet: `BackendNotImplemented`.

Inputs: resource documents as dicts (apiVersion, kind, metadata, spec). Outputs: documents
as dicts; `ApplyResult`s.

Invariants: `apply()` validates every document first (keyable, plus the injectable
`validate(doc)` hook, by default `minimal_validate`: apiVersion/kind known) and writes
nothing if any is invalid. Every error is a `DatastoreClientError` with a message fit to
show a user as is (the CLI wraps it in a click.ClickException); `DatastoreUnavailable`, a
subclass, when the datastore could not be reached at all (worth retrying: the agent waits
for its datastore at start-up on exactly this error).

Kind names on the command line are case-insensitive, singular or plural
(`GlobalNetworkPolicy`, `globalnetworkpolicies`); `resolve_kind()` maps them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.syncer.api import (
    K8S_NETWORKING_API,
    KIND_K8S_NETWORK_POLICY,
    DatastoreError,
    ResourceKey,
    Syncer,
    key_of,
)

CALICO_API = "projectcalico.org/v3"
K8S_CORE_API = "v1"


# --------------------------------------------------------------------------------------------
# Errors


class DatastoreClientError(Exception):
    """An error to show the user as is (bad URL, invalid input, missing resource...)."""


class DatastoreUnavailable(DatastoreClientError):
    """The datastore could not be reached or did not answer (connection refused, timeout,
    a server error): the same request may succeed later. Refusals (bad credentials, invalid
    input) are plain `DatastoreClientError`s."""


class DatastoreURLError(DatastoreClientError, ValueError):
    """The --datastore value is not one of the accepted forms."""


class BackendNotImplemented(DatastoreClientError, NotImplementedError):
    """The --datastore names a backend that pyfelix does not implement yet."""


class InvalidResources(DatastoreClientError, ValueError):
    """Some input documents are invalid; nothing was written."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        header = f"{count} invalid resource{'s' if count != 1 else ''}; nothing was written:"
        super().__init__("\n".join([header, *(f"  {p}" for p in self.problems)]))


class ResourceNotFound(DatastoreClientError, LookupError):
    """The resource to delete or get does not exist."""


# --------------------------------------------------------------------------------------------
# Kinds


@dataclass(frozen=True)
class KindInfo:
    kind: str  # the kind as keyed inside pyfelix (ResourceKey.kind)
    api_version: str
    document_kind: str  # the `kind:` written in documents
    plural: str
    namespaced: bool


_CALICO_KINDS = (
    ("GlobalNetworkPolicy", False), ("NetworkPolicy", True), ("GlobalNetworkSet", False),
    ("NetworkSet", True), ("WorkloadEndpoint", True), ("HostEndpoint", False),
    ("Profile", False), ("Tier", False), ("IPPool", False), ("Node", False),
    ("BGPConfiguration", False), ("BGPPeer", False), ("FelixConfiguration", False),
)

def _plural(kind: str) -> str:
    lower = kind.lower()
    return lower[:-1] + "ies" if lower.endswith("y") else lower + "s"


KINDS: tuple[KindInfo, ...] = (
    *(KindInfo(kind, CALICO_API, kind, _plural(kind), namespaced)
      for kind, namespaced in _CALICO_KINDS),
    KindInfo("Pod", K8S_CORE_API, "Pod", "pods", True),
    KindInfo("Namespace", K8S_CORE_API, "Namespace", "namespaces", False),
    KindInfo("ServiceAccount", K8S_CORE_API, "ServiceAccount", "serviceaccounts", True),
    KindInfo(KIND_K8S_NETWORK_POLICY, K8S_NETWORKING_API, "NetworkPolicy",
             "kubernetesnetworkpolicies", True),
)

_KIND_BY_NAME: dict[str, KindInfo] = {}
for _info in KINDS:
    _KIND_BY_NAME[_info.kind.lower()] = _info
    _KIND_BY_NAME[_info.plural] = _info
_KNOWN_DOCUMENT_KINDS = {(info.api_version, info.document_kind) for info in KINDS}


def resolve_kind(text: str) -> KindInfo:
    """A kind from its name or plural, any case; raises DatastoreClientError if unknown."""
    info = _KIND_BY_NAME.get(text.strip().lower())
    if info is None:
        known = ", ".join(sorted(i.kind for i in KINDS))
        raise DatastoreClientError(f"unknown resource kind {text!r}; known kinds: {known} "
                                   "(singular or plural, any case)")
    return info


def minimal_validate(doc: Mapping[str, Any]) -> None:
    """The default `validate` hook: keyable, and apiVersion/kind is a pair pyfelix knows.

    Raises ValueError naming the resource and the field.
    """
    key = key_of(doc)
    api_version = doc.get("apiVersion")
    kind = doc.get("kind")
    if (api_version, kind) in _KNOWN_DOCUMENT_KINDS:
        return
    expected = sorted(info.api_version for info in KINDS if info.document_kind == kind)
    if expected:
        raise ValueError(f"{key}: field 'apiVersion' is {api_version!r}; expected "
                         f"{' or '.join(expected)} for kind {kind}")
    raise ValueError(f"{key}: field 'kind' {kind!r} is not a kind pyfelix knows")


Validator = Callable[[Mapping[str, Any]], None]


# --------------------------------------------------------------------------------------------
# The client interface


@dataclass(frozen=True)
class ApplyResult:
    key: ResourceKey
    action: str  # "created", "configured" or "unchanged"


class Datastore(Protocol):
    """Read/write access to one datastore, as `calicoctl` offers it."""

    @property
    def description(self) -> str:
        """Where the data lives, for messages: "file datastore ./resources"."""

    @property
    def warnings(self) -> list[DatastoreError]:
        """Problems met by the last read (unparsable files, duplicates), for the CLI."""

    def apply(self, docs: Sequence[Mapping[str, Any]], *,
              sources: Sequence[str] | None = None) -> list[ApplyResult]:
        """Create or replace every document; all or nothing if any is invalid."""

    def delete(self, key: ResourceKey) -> None:
        """Remove a resource; ResourceNotFound if it does not exist."""

    def get(self, kind: str, name: str | None = None,
            namespace: str | None = None) -> list[dict[str, Any]]:
        """Documents of a kind (the keyed kind), optionally one name / one namespace
        (namespace None: every namespace); sorted by key."""

    def list(self) -> dict[ResourceKey, dict[str, Any]]:
        """Every resource, by key."""


# --------------------------------------------------------------------------------------------
# --datastore URLs and the factories


@dataclass(frozen=True)
class DatastoreLocation:
    backend: str  # "file", "etcd3", "kubernetes" or "typha"
    path: str = ""  # file backend
    endpoints: tuple[str, ...] = ()  # etcd3 / typha: "host:port"


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


def open_datastore(url: str, *, validate: Validator | None = None) -> Datastore:
    """A client for the datastore a --datastore value names."""
    location = parse_datastore_url(url)
    if location.backend == "file":
        from agent.syncer.file_store import FileDatastore

        return FileDatastore(location.path, validate=validate or minimal_validate)
    if location.backend == "etcd3":
        from agent.syncer.etcd_store import open_etcd_datastore

        return open_etcd_datastore(location.endpoints, validate=validate or minimal_validate)
    if location.backend == "kubernetes":
        from agent.syncer.kube_store import open_kube_datastore

        return open_kube_datastore(validate=validate or minimal_validate)
    if location.backend == "typha":
        raise DatastoreURLError(
            f"--datastore {url!r}: Typha only fans out the datastore's watch (read-only); "
            "apply, delete and get need the datastore itself")
    raise _not_implemented(location)


def make_syncer(url: str, *, syncer_type: str = "felix", hostname: str = "",
                **options: Any) -> Syncer:
    """The syncer for a --datastore value; `options` go to the backend's constructor
    (file backend: poll_interval, debounce, use_inotify, rescan_interval...).

    `syncer_type` ("felix": every kind; "bgp": what confd needs) and `hostname` matter only
    to Typha, which serves one filtered stream per syncer type; a direct datastore syncer
    carries every kind and its consumer picks what it needs."""
    location = parse_datastore_url(url)
    if location.backend == "typha":
        from agent.typha.client import TyphaConfigError, make_typha_syncer

        try:
            return make_typha_syncer(location.endpoints, syncer_type=syncer_type,
                                     hostname=hostname, **options)
        except TyphaConfigError as exc:
            raise DatastoreURLError(str(exc)) from None
    if location.backend == "file":
        from agent.syncer.file import FileSyncer

        return FileSyncer(os.path.normpath(location.path), **options)
    if location.backend == "etcd3":
        from agent.syncer.etcd import make_etcd_syncer

        return make_etcd_syncer(location.endpoints, **options)
    if location.backend == "kubernetes":
        from agent.syncer.kube import make_kube_syncer

        return make_kube_syncer(**options)
    raise _not_implemented(location)
