"""The Kubernetes datastore client behind `pyfelix apply/delete/get --datastore kubernetes`.

Role: implements `agent.syncer.client.Datastore` for the Calico kinds Calico keeps in CRDs
(`agent.syncer.kube_resources.CRD_TYPES`): documents are stored as
`crd.projectcalico.org/v1` custom objects and read back as `projectcalico.org/v3`
documents, exactly as the Kubernetes syncer converts them. Pods, Namespaces,
ServiceAccounts, Nodes and Kubernetes NetworkPolicies belong to Kubernetes itself: create
them with kubectl; this client refuses them with a message saying so.

Inputs: documents (dicts) and keys; a `KubeAPI`. Outputs: custom objects created
(POST), replaced (PUT with the resourceVersion just read) or deleted (DELETE).

Invariants: `apply` checks every document first (keyable, the injectable `validate` hook,
a CRD-backed kind, no key twice) and writes nothing if any fails, naming each problem;
an unchanged document is not written; a replace that meets a concurrent change (409)
is re-read and retried a few times, never forced. The writes of one apply are separate
requests, not a transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyfelix.agent.inputs import InputError, check_document
from pyfelix.agent.syncer.api import DatastoreError, ResourceKey, key_of
from pyfelix.agent.syncer.client import (
    ApplyResult,
    DatastoreClientError,
    DatastoreUnavailable,
    ResourceNotFound,
    Validator,
    minimal_validate,
)
from pyfelix.agent.syncer.kube_api import (
    KubeAPI,
    KubeConflict,
    KubeError,
    KubeHTTPError,
    KubeNotFound,
    KubeUnavailable,
)
from pyfelix.agent.syncer.kube_resources import (
    CRD_TYPES,
    ResourceType,
    crd_type,
    to_crd_object,
    to_document,
)
from pyfelix.agent.syncer.write_checks import checked_documents

CONFLICT_RETRIES = 3
_CRD_KINDS = ", ".join(sorted(rtype.kind for rtype in CRD_TYPES))


def _crd_type_of(kind: str) -> ResourceType:
    rtype = crd_type(kind)
    if rtype is None:
        raise ValueError(f"kind {kind} cannot be written through the Kubernetes datastore: "
                         f"pyfelix stores only Calico's CRD kinds there ({_CRD_KINDS}); "
                         "Pods, Namespaces, ServiceAccounts, Nodes and NetworkPolicies of "
                         "networking.k8s.io are Kubernetes' own (use kubectl)")
    return rtype


def _check_crd_kind(key: ResourceKey, doc: Mapping[str, Any]) -> None:
    try:
        _crd_type_of(key.kind)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def _acceptable(obj: dict[str, Any], rtype: ResourceType) -> bool:
    """Whether a stored object is within the input limits (agent.inputs)."""
    try:
        check_document(obj, kind=rtype.kind)
    except InputError:
        return False
    return True


class KubeDatastore:
    """Read/write access to Calico CRDs in a Kubernetes API server."""

    def __init__(self, api: KubeAPI, *, validate: Validator = minimal_validate,
                 page_size: int = 500) -> None:
        self.api = api
        self._validate = validate
        self._page_size = page_size
        self._warnings: list[DatastoreError] = []

    @property
    def description(self) -> str:
        return f"kubernetes datastore {self.api.host}"

    @property
    def warnings(self) -> list[DatastoreError]:
        return list(self._warnings)

    # -- reads --

    def _list_type(self, rtype: ResourceType) -> dict[ResourceKey, dict[str, Any]]:
        found: dict[ResourceKey, dict[str, Any]] = {}
        token = ""
        while True:
            try:
                page = self.api.list_page(rtype, limit=self._page_size, continue_token=token)
            except KubeNotFound:
                return found  # the CRD is not installed: nothing stored
            except KubeError as exc:
                raise _client_error(exc) from exc
            for item in page.get("items") or []:
                try:
                    check_document(item, kind=rtype.kind)
                    doc = to_document(rtype, item)
                    found[key_of(doc)] = doc
                except ValueError as exc:  # InputError is one
                    self._warnings.append(DatastoreError(
                        f"kubernetes:{rtype.collection_path()}", f"{exc}; skipped"))
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return found

    def list(self) -> dict[ResourceKey, dict[str, Any]]:
        self._warnings = []
        found: dict[ResourceKey, dict[str, Any]] = {}
        for rtype in CRD_TYPES:
            found.update(self._list_type(rtype))
        return found

    def get(self, kind: str, name: str | None = None,
            namespace: str | None = None) -> list[dict[str, Any]]:
        try:
            rtype = _crd_type_of(kind)
        except ValueError as exc:
            raise DatastoreClientError(str(exc)) from exc
        self._warnings = []
        return [doc for key, doc in sorted(self._list_type(rtype).items())
                if (name is None or key.name == name)
                and (namespace is None or key.namespace == namespace)]

    # -- writes --

    def apply(self, docs: Sequence[Mapping[str, Any]], *,
              sources: Sequence[str] | None = None) -> list[ApplyResult]:
        keyed = checked_documents(docs, sources, self._validate, _check_crd_kind)
        return [self._apply_one(key, doc) for key, doc in keyed]

    def _apply_one(self, key: ResourceKey, doc: dict[str, Any]) -> ApplyResult:
        rtype = _crd_type_of(key.kind)
        wanted = to_crd_object(doc)
        if rtype.namespaced:
            wanted["metadata"]["namespace"] = key.namespace
        path = rtype.object_path(key.namespace, key.name)
        for _ in range(CONFLICT_RETRIES):
            try:
                current = self.api.request_json("GET", path)
            except KubeNotFound:
                current = None
            except KubeError as exc:
                raise DatastoreClientError(str(exc)) from exc
            try:
                if current is None:
                    self.api.request_json("POST", rtype.collection_path(key.namespace or None),
                                          body=wanted)
                    return ApplyResult(key, "created")
                if (_acceptable(current, rtype)
                        and to_document(rtype, current) == to_document(rtype, wanted)):
                    return ApplyResult(key, "unchanged")  # (a rejected one is replaced)
                replacement = dict(wanted, metadata=dict(
                    wanted["metadata"],
                    resourceVersion=(current.get("metadata") or {}).get("resourceVersion")))
                self.api.request_json("PUT", path, body=replacement)
                return ApplyResult(key, "configured")
            except KubeConflict:
                continue  # created or changed meanwhile: read again
            except KubeError as exc:
                raise DatastoreClientError(f"{key}: {exc}") from exc
        raise DatastoreClientError(f"{key} kept changing in the Kubernetes API while applying "
                                   f"it ({CONFLICT_RETRIES} attempts)")

    def delete(self, key: ResourceKey) -> None:
        try:
            rtype = _crd_type_of(key.kind)
        except ValueError as exc:
            raise DatastoreClientError(str(exc)) from exc
        try:
            self.api.request_json("DELETE", rtype.object_path(key.namespace, key.name))
        except KubeNotFound as exc:
            raise ResourceNotFound(f"{key} not found in {self.description}") from exc
        except KubeError as exc:
            raise DatastoreClientError(str(exc)) from exc


def _client_error(exc: KubeError) -> DatastoreClientError:
    """Unreachable API server, or one answering 429/5xx: `DatastoreUnavailable` (a retry
    may succeed); any other refusal (401, 403, 400...) as is."""
    if isinstance(exc, KubeUnavailable) or (
            isinstance(exc, KubeHTTPError) and (exc.status == 429 or exc.status >= 500)):
        return DatastoreUnavailable(str(exc))
    return DatastoreClientError(str(exc))


def open_kube_datastore(*, validate: Validator = minimal_validate, kubeconfig: str | None = None,
                        context: str | None = None) -> KubeDatastore:
    """The client for `--datastore kubernetes` (credentials as `make_kube_syncer`)."""
    try:
        api = KubeAPI.from_environment(kubeconfig, context)
    except KubeError as exc:
        raise DatastoreClientError(str(exc)) from exc
    return KubeDatastore(api, validate=validate)
