"""Checks every datastore client runs on `apply` input before writing anything.

Role: shared by the etcd, Kubernetes and file clients (`agent.syncer.etcd_store`,
`agent.syncer.kube_store`, `agent.syncer.file_store`). Input: the documents and, optionally,
a label per document (`"policy.yaml#2"`). Output: `(key, document)` pairs in input order,
or `InvalidResources` listing EVERY problem (label, resource, field) so the user can fix
them all at once.

Checks: the document can be keyed (`key_of`), passes the injected `validate` hook (which
raises ValueError naming resource and field), passes the backend's own `check(key, doc)`
(for instance "this kind can be stored here", or "this name can be a file name"), and its
key appears only once in the input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyfelix.agent.syncer.api import ResourceKey, key_of
from pyfelix.agent.syncer.client import InvalidResources, Validator

BackendCheck = Callable[[ResourceKey, Mapping[str, Any]], None]


def checked_documents(docs: Sequence[Mapping[str, Any]], sources: Sequence[str] | None,
                      validate: Validator, backend_check: BackendCheck | None = None,
                      ) -> list[tuple[ResourceKey, dict[str, Any]]]:
    problems: list[str] = []
    keyed: list[tuple[ResourceKey, dict[str, Any]]] = []
    seen: dict[ResourceKey, str] = {}
    for position, doc in enumerate(docs):
        label = sources[position] if sources and position < len(sources) else (
            f"document {position + 1}")
        try:
            key = key_of(doc)
            validate(doc)
            if backend_check is not None:
                backend_check(key, doc)
        except ValueError as exc:
            problems.append(f"{label}: {exc}")
            continue
        if key in seen:
            problems.append(f"{label}: {key} appears twice in the input (also {seen[key]})")
            continue
        seen[key] = label
        keyed.append((key, dict(doc)))
    if problems:
        raise InvalidResources(problems)
    return keyed
