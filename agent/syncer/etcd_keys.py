"""Where resources live in etcd: the key layout shared by the etcd syncer and the etcd client.

Role: map a `ResourceKey` to its etcd key and back, and decode stored values.

Layout (every value is the whole resource document as JSON, exactly as applied):
- Calico kinds (`projectcalico.org/v3`), Calico's own v3 layout:
  `/calico/resources/v3/projectcalico.org/<plural>/[<namespace>/]<name>`,
  e.g. `/calico/resources/v3/projectcalico.org/globalnetworkpolicies/deny-all`;
- Kubernetes kinds pyfelix accepts (`v1` Pod, Namespace, ServiceAccount and
  `networking.k8s.io/v1` NetworkPolicy), which Calico never stores in etcd, under a
  sibling directory no Calico tool reads:
  `/calico/resources/v3/kubernetes/<plural>/[<namespace>/]<name>`, e.g.
  `/calico/resources/v3/kubernetes/pods/shop/web-1`; Kubernetes NetworkPolicies use the
  plural `kubernetesnetworkpolicies` (their pyfelix kind, so they never meet Calico's).
Plurals, directories and namespacing come from the kind catalogue (`agent.kinds`), so the
client and the syncer cannot disagree. One watch on `/calico/resources/v3/` therefore
sees everything.

Invariants: `etcd_key(parse_etcd_key(k)) == k` for every key `parse_etcd_key` accepts; a
value decodes only if it is a JSON object whose own key (`key_of`) equals the key its path
names, so a document stored under the wrong path is an error, not a silent rename.

Easy to get wrong: keys under the prefix that are not ours (other Calico v3 kinds such as
`ipamconfigs`) must be skipped quietly, while a malformed key of a kind we know is
an error worth reporting.
"""

from __future__ import annotations

import json
from typing import Any

from pyfelix.agent.inputs import InputError, decode_json_document
from pyfelix.agent.kinds import ETCD_ROOT, KINDS, KindInfo
from pyfelix.agent.syncer.api import ResourceKey, key_of

_BY_KIND = {info.kind: info for info in KINDS}
_BY_DIRECTORY_PLURAL = {(info.etcd_directory, info.plural): info for info in KINDS}


class EtcdKeyError(ValueError):
    """A key under our prefix, of a kind we know, that does not follow the layout."""


def layout_of(kind: str) -> KindInfo:
    layout = _BY_KIND.get(kind)
    if layout is None:
        raise EtcdKeyError(f"kind {kind!r} has no etcd layout")
    return layout


def _check_segment(what: str, value: str, key: ResourceKey) -> None:
    if not value or "/" in value or value in (".", ".."):
        raise EtcdKeyError(f"{key}: {what} {value!r} cannot be part of an etcd key "
                           "(empty, '.', '..' or containing '/')")


def etcd_key(key: ResourceKey) -> str:
    """The etcd key of a resource; raises EtcdKeyError for an unusable name or kind."""
    layout = layout_of(key.kind)
    _check_segment("metadata.name", key.name, key)
    if layout.namespaced:
        _check_segment("metadata.namespace", key.namespace, key)
        return f"{layout.etcd_prefix}{key.namespace}/{key.name}"
    return f"{layout.etcd_prefix}{key.name}"


def kind_prefix(kind: str, namespace: str | None = None) -> str:
    """The etcd prefix holding every resource of a kind (or one namespace of it)."""
    layout = layout_of(kind)
    if namespace is not None and layout.namespaced:
        return f"{layout.etcd_prefix}{namespace}/"
    return layout.etcd_prefix


def parse_etcd_key(path: str) -> ResourceKey | None:
    """The resource key an etcd key names; None if it is not ours (another prefix or kind).

    Raises EtcdKeyError if the key has one of our kinds but the wrong shape.
    """
    if not path.startswith(ETCD_ROOT):
        return None
    parts = path[len(ETCD_ROOT):].split("/")
    if len(parts) < 2:
        return None
    layout = _BY_DIRECTORY_PLURAL.get((parts[0], parts[1]))
    if layout is None:
        return None
    rest = parts[2:]
    expected = 2 if layout.namespaced else 1
    if len(rest) != expected or not all(rest):
        shape = "<namespace>/<name>" if layout.namespaced else "<name>"
        raise EtcdKeyError(f"etcd key {path!r} does not follow the layout "
                           f"{layout.etcd_prefix}{shape}")
    if layout.namespaced:
        return ResourceKey(layout.kind, rest[0], rest[1])
    return ResourceKey(layout.kind, "", rest[0])


def encode_value(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_value(path: str, key: ResourceKey, raw: bytes) -> dict[str, Any]:
    """Decode a stored document (`agent.inputs`: size, depth, duplicate keys... limits);
    raises ValueError naming the etcd key, the resource, the field and the problem."""
    try:
        doc = decode_json_document(raw, resource=str(key))
    except InputError as exc:
        raise ValueError(f"etcd key {path}: value rejected: {exc}") from exc
    try:
        own_key = key_of(doc)
    except ValueError as exc:
        raise ValueError(f"etcd key {path}: {exc}") from exc
    if own_key != key:
        raise ValueError(f"etcd key {path}: the document inside is {own_key}, but the key "
                         f"names {key}")
    return doc
