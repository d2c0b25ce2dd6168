"""Shared pieces of every resource: `Metadata`, `Resource`, metadata parsing, address fields.

Role: the base layer of `agent.model`'s resource modules (`resources`, `infrastructure`,
`kubernetes`); nothing here knows a particular kind beyond its name rules.

Inputs: raw documents and `Fields` readers. Outputs: `Metadata`, checked address strings, or
`ValidationError` naming resource and field.

Invariants: names are checked as Calico checks them (DNS-1123 subdomains in general; DNS
labels for tiers and namespaces; Calico's policy-name patterns for policies); labels and
annotation keys as Kubernetes checks them; metadata fields beyond Kubernetes' ObjectMeta are
rejected. References to nodes (`node_name`) and profiles (`name_list`) are checked as names
too. Every pattern must match the whole text (`re.fullmatch`; `$` would let a trailing
newline through into generated config). Error messages show keys bounded and printable
(`shown_key`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyfelix.agent.model.fields import Fields, ValidationError
from pyfelix.agent.model.names import is_dns_label, is_dns_subdomain, qualified_name_problem
from pyfelix.agent.model.rules import normalise_ip, parse_net
from pyfelix.agent.syncer.api import ResourceKey, key_of

# Calico's policy name rules (libcalico-go validator).
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# Used with fullmatch only (`$` would accept a trailing newline).
_NP_NAME_RE = re.compile(
    rf"(({_LABEL})(\.{_LABEL})?|((knp|ossg)\.default\.{_LABEL}(\.{_LABEL})*))")
_GNP_NAME_RE = re.compile(rf"({_LABEL}\.)?{_LABEL}")


@dataclass(frozen=True, slots=True)
class Metadata:
    name: str
    namespace: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    uid: str = ""
    resource_version: str = ""

    @property
    def labels_dict(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def annotations_dict(self) -> dict[str, str]:
        return dict(self.annotations)


@dataclass(frozen=True, slots=True)
class Resource:
    key: ResourceKey
    meta: Metadata


METADATA_FIELDS = frozenset({
    "name", "namespace", "labels", "annotations", "uid", "resourceVersion",
    "creationTimestamp", "generation", "generateName", "ownerReferences", "finalizers",
    "managedFields", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink",
})

_NAME_RULES: dict[str, tuple[Callable[[str], bool], str]] = {
    "Tier": (is_dns_label, "a DNS label (lower case letters, digits and '-')"),
    "Namespace": (is_dns_label, "a DNS label (lower case letters, digits and '-')"),
    "NetworkPolicy": (lambda n: bool(_NP_NAME_RE.fullmatch(n)) and len(n) <= 253,
                      "lower case letters, digits and '-', with at most one '.'"),
    "GlobalNetworkPolicy": (lambda n: bool(_GNP_NAME_RE.fullmatch(n)) and len(n) <= 253,
                            "lower case letters, digits and '-', with at most one '.'"),
}

_DEFAULT_NAME_RULE = (is_dns_subdomain, "a DNS subdomain (lower case letters, digits, '-', '.')")


def printable(text: str) -> str:
    """`text` for an error message: control characters (a newline in a name) escaped."""
    return text if text.isprintable() else repr(text)[1:-1]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def shown_key(key: ResourceKey) -> str:
    """`Kind(namespace/name)` for an error message: bounded (a name longer than any valid
    one is cut) and printable (see `printable`)."""
    return printable(str(ResourceKey(_cut(key.kind, 60), _cut(key.namespace, 63),
                                     _cut(key.name, 253))))


def describe_document(doc: Any) -> str:
    """`Kind(namespace/name)` as far as the document allows, with `?` for what is missing."""
    try:
        return shown_key(key_of(doc))
    except ValueError:
        pass
    if not isinstance(doc, dict):
        return "document(?)"
    kind = doc.get("kind")
    kind_text = kind if isinstance(kind, str) and kind else "?"
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    name_text = name if isinstance(name, str) and name else "?"
    return printable(f"{kind_text[:60]}({name_text[:120]})")


def check_key_fields(doc: Any, described: str) -> None:
    """Fail with a precise field path when `key_of` would fail."""
    if not isinstance(doc, dict):
        raise ValidationError(described, "", f"document is {type(doc).__name__}, not a mapping")
    kind = doc.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ValidationError(described, "kind", "missing, empty or not a string")
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        raise ValidationError(described, "metadata", "missing or not a mapping")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValidationError(described, "metadata.name", "missing, empty or not a string")
    namespace = meta.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise ValidationError(described, "metadata.namespace", "not a string")


def parse_metadata(meta: Fields, key: ResourceKey) -> Metadata:
    meta.only(METADATA_FIELDS)
    check, wanted = _NAME_RULES.get(key.kind, _DEFAULT_NAME_RULE)
    if not check(key.name):
        meta.fail("name", f"{key.name[:80]!r} is not a valid name: expected {wanted}")
    if key.namespace and not is_dns_label(key.namespace):
        meta.fail("namespace", f"{key.namespace[:80]!r} is not a valid namespace name")
    annotations = meta.str_map("annotations")
    for k in annotations:
        problem = qualified_name_problem(k.lower())
        if problem:
            meta.fail(f"annotations.{k}", f"invalid annotation key: {problem}")
    uid = meta.raw("uid")
    version = meta.raw("resourceVersion")
    return Metadata(
        name=key.name,
        namespace=key.namespace,
        labels=tuple(sorted(meta.labels("labels").items())),
        annotations=tuple(sorted(annotations.items())),
        uid=uid if isinstance(uid, str) else "",
        resource_version=str(version) if isinstance(version, str | int) else "",
    )


def with_labels(meta: Metadata, extra: dict[str, str]) -> Metadata:
    merged = dict(meta.labels)
    merged.update(extra)
    return Metadata(meta.name, meta.namespace, tuple(sorted(merged.items())), meta.annotations,
                    meta.uid, meta.resource_version)


def ip_address_field(text: Any, fields: Fields, key: str) -> str:
    if not isinstance(text, str):
        fields.fail(key, f"expected an IP address string, got {type(text).__name__}")
    address = normalise_ip(text.strip())
    if address is None:
        fields.fail(key, f"invalid IP address {text[:60]!r}")
    return address


def ip_address_list(spec: Fields, key: str) -> tuple[str, ...]:
    return tuple(ip_address_field(t, spec, f"{key}[{i}]") for i, t in enumerate(spec.list(key)))


def net_list(spec: Fields, key: str) -> tuple[str, ...]:
    return tuple(parse_net(t, spec, f"{key}[{i}]") for i, t in enumerate(spec.list(key)))


def optional_ip(fields: Fields, key: str) -> str:
    text = fields.str(key)
    return ip_address_field(text, fields, key) if text else ""


def node_name(fields: Fields, key: str, *, required: bool = False) -> str:
    """A reference to a Node by name: a DNS subdomain, as Node names are."""
    name = fields.str(key, required=required)
    if name and not is_dns_subdomain(name):
        fields.fail(key, f"{name[:80]!r} is not a valid node name: expected "
                    f"{_DEFAULT_NAME_RULE[1]}")
    return name


def name_list(fields: Fields, key: str) -> tuple[str, ...]:
    """References to resources by name (a WorkloadEndpoint's profiles): DNS subdomains."""
    names = fields.str_list(key)
    for i, name in enumerate(names):
        if not is_dns_subdomain(name):
            fields.fail(f"{key}[{i}]", f"{name[:80]!r} is not a valid name: expected "
                        f"{_DEFAULT_NAME_RULE[1]}")
    return names
