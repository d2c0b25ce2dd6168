"""The datastore clients' vocabulary: errors, kind names, the `Datastore` protocol.

Role: one small read/write interface (`Datastore`) that every backend implements
(file_store, etcd_store, kube_store), so the CLI commands hold no backend logic; the
factories that pick a backend from a `--datastore` value (`open_datastore`, `make_syncer`)
live above every backend, Typha's client included, in `agent.datastore`
(docs/ARCHITECTURE.md section 2).

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pyfelix.agent.kinds import CLI_KINDS, KindInfo, kind_named
from pyfelix.agent.syncer.api import DatastoreError, ResourceKey, key_of

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
# Kinds (the catalogue itself is agent.kinds)

_KNOWN_DOCUMENT_FORMS = {(info.api_version, info.document_kind) for info in CLI_KINDS}


def resolve_kind(text: str) -> KindInfo:
    """A kind from its name or plural, any case; raises DatastoreClientError if unknown."""
    info = kind_named(text)
    if info is None:
        known = ", ".join(sorted(i.kind for i in CLI_KINDS))
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
    if (api_version, kind) in _KNOWN_DOCUMENT_FORMS:
        return
    expected = sorted(info.api_version for info in CLI_KINDS if info.document_kind == kind)
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
