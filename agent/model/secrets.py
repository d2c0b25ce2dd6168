"""Kubernetes `v1 Secret`, typed and validated: where BGP passwords come from (BGPPeer and
BGPConfiguration `password.secretKeyRef`; confd resolves them, the agent never reads them).

Inputs: the whole document as `Fields`, as kubectl takes it (`data`: base64 values,
`stringData`: plain strings, merged over `data` as the API server merges them on write) or
as the API server returns it (`data` only). Output: a frozen `Secret`, or `ValidationError`
naming the resource and the field (the key), never the value.

Invariants (a secret must not leak): the values are kept out of `repr()` (a logged or
asserted model object shows the keys only); metadata annotations are dropped (kubectl's
`last-applied-configuration` annotation holds the whole Secret, values included); no error
message quotes a value, only its key and what is wrong with it.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field

from pyfelix.agent.model.base import Metadata, Resource
from pyfelix.agent.model.fields import Fields
from pyfelix.agent.syncer.api import ResourceKey

# Kubernetes' rule for Secret (and ConfigMap) keys; fullmatch only.
_KEY_RE = re.compile(r"[-._a-zA-Z0-9]{1,253}")
_TOP_FIELDS = frozenset({"apiVersion", "kind", "metadata", "data", "stringData", "type",
                         "immutable"})


@dataclass(frozen=True)
class Secret(Resource):
    type: str = "Opaque"
    # key -> value (decoded text); repr=False: never shown by repr/logs
    data: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.data)

    def value(self, key: str) -> str | None:
        """The value of `key`, or None when the Secret has no such key."""
        for k, v in self.data:
            if k == key:
                return v
        return None


def _values(top: Fields, name: str, *, encoded: bool) -> dict[str, str]:
    raw = top.raw(name)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        top.fail(name, "expected a mapping of keys to values")
    out: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key) or key in (".", ".."):
            top.fail(name, "a key is not a valid Secret key (letters, digits, '-', '_', '.')")
        where = f"{name}.{key}"
        if not isinstance(value, str):
            top.fail(where, "expected a string value")  # never the value itself
        if encoded:
            try:
                decoded = base64.b64decode(value.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError, ValueError):
                top.fail(where, "not valid base64")
            try:
                value = decoded.decode("utf-8")
            except UnicodeDecodeError:
                top.fail(where, "the decoded value is not UTF-8 text")
        out[key] = value
    return out


def parse_secret(top: Fields, key: ResourceKey, meta: Metadata) -> Secret:
    top.only(_TOP_FIELDS)
    data = _values(top, "data", encoded=True)
    data.update(_values(top, "stringData", encoded=False))
    kept = Metadata(meta.name, meta.namespace, meta.labels, (), meta.uid, meta.resource_version)
    return Secret(key, kept, type=top.str("type", "Opaque") or "Opaque",
                  data=tuple(sorted(data.items())))
