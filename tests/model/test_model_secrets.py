"""v1 Secrets and BGP password references: decoding as kubectl takes them, errors that name
the field but never the value, values kept out of repr()."""

from __future__ import annotations

import base64

import pytest

from pyfelix.agent.model import BGPPeer, Secret, SecretKeyRef, ValidationError, parse_resource
from tests.model.examples import by_kind, load

SECRET_VALUE = "n0t-for-logs-7f3a"


def _secret(body: str) -> dict:
    return load("{apiVersion: v1, kind: Secret, metadata: {name: s, namespace: kube-system}, "
                + body + "}")


def test_data_is_base64_and_string_data_wins_over_it() -> None:
    encoded = base64.b64encode(b"from-data").decode()
    secret = parse_resource(_secret(f"data: {{a: {encoded}, b: {encoded}}}, "
                                    "stringData: {b: plain, c: other}"))
    assert isinstance(secret, Secret)
    assert (secret.value("a"), secret.value("b"), secret.value("c")) == (
        "from-data", "plain", "other")
    assert secret.value("missing") is None
    assert secret.keys == ("a", "b", "c")


def test_example_secret_and_peer_reference() -> None:
    secret = parse_resource(by_kind("Secret"))
    assert secret.value("rr-password") == "very-secret"
    peer = parse_resource(load("{apiVersion: projectcalico.org/v3, kind: BGPPeer, metadata: "
                               "{name: p}, spec: {peerIP: 198.18.0.9, asNumber: 65000, "
                               "password: {secretKeyRef: {name: bgp-secrets, key: k}}, "
                               "filters: [f1, f2]}}"))
    assert isinstance(peer, BGPPeer)
    assert peer.password_secret == SecretKeyRef("bgp-secrets", "k")
    assert peer.password == ""
    assert peer.filters == ("f1", "f2")


def test_values_are_not_in_repr_and_annotations_are_dropped() -> None:
    doc = _secret(f"stringData: {{pw: {SECRET_VALUE}}}")
    doc["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": f'{{"stringData":"{SECRET_VALUE}"}}'}
    secret = parse_resource(doc)
    assert secret.value("pw") == SECRET_VALUE
    assert SECRET_VALUE not in repr(secret)
    assert secret.meta.annotations == ()
    peer = parse_resource(load("{apiVersion: projectcalico.org/v3, kind: BGPPeer, metadata: "
                               "{name: p}, spec: {peerIP: 198.18.0.9, asNumber: 65000, "
                               f"password: {{value: {SECRET_VALUE}}}}}}}"))
    assert peer.password == SECRET_VALUE
    assert SECRET_VALUE not in repr(peer)


@pytest.mark.parametrize(("body", "field", "message"), [
    (f"data: {{pw: '{SECRET_VALUE}!'}}", "data.pw", "not valid base64"),
    ("data: {pw: " + base64.b64encode(b"\xff\xfe" + SECRET_VALUE.encode()).decode() + "}",
     "data.pw", "not UTF-8"),
    ("stringData: {pw: 12345}", "stringData.pw", "expected a string"),
    (f"stringData: {{'bad/key': {SECRET_VALUE}}}", "stringData", "not a valid Secret key"),
    (f"stringData: [{SECRET_VALUE}]", "stringData", "expected a mapping"),
    ("spec: {}", "spec", "unknown field"),
])
def test_bad_secrets_name_the_field_never_the_value(body: str, field: str,
                                                    message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_resource(_secret(body))
    assert info.value.field == field
    assert message in info.value.message
    assert SECRET_VALUE not in str(info.value)
    assert "12345" not in str(info.value)


@pytest.mark.parametrize(("password", "field"), [
    ("{secretKeyRef: {name: s}}", "spec.password.secretKeyRef.key"),
    ("{secretKeyRef: {name: Bad_Name, key: k}}", "spec.password.secretKeyRef.name"),
    ("{secretKeyRef: {name: s, key: 'a/b'}}", "spec.password.secretKeyRef.key"),
    ("{secretKeyRef: {name: s, key: k}, value: x}", "spec.password"),
    ("{value: 7}", "spec.password.value"),
])
def test_bad_password_references(password: str, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_resource(load("{apiVersion: projectcalico.org/v3, kind: BGPPeer, metadata: "
                            "{name: p}, spec: {peerIP: 198.18.0.9, asNumber: 65000, "
                            f"password: {password}}}}}"))
    assert info.value.field == field
