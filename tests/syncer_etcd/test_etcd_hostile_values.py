"""Hostile etcd values are rejected one key at a time; the syncer carries on.

A 200,000-deep JSON value used to raise RecursionError out of the value decoder, which is
not a ValueError, so the syncer's list failed, restarted, met the same value, and never got
in sync. Now every value goes through `agent.inputs.decode_json_document` (size, depth,
duplicate keys, integer digits): a rejected value is reported (naming the etcd key, the
resource and the field), counted, and handled as a delete of its key, like any other
unusable value. Same fake etcd as test_etcd_rejected_values.py.
"""

from __future__ import annotations

from pyfelix.agent.syncer.etcd_keys import decode_value, encode_value, etcd_key
from tests.syncer.syncer_testlib import gnp, gnp_key
from tests.syncer_etcd.test_etcd_rejected_values import (
    FakeEtcd,
    _parse_errors,
    _response,
    _syncer,
)

GOOD = etcd_key(gnp_key("good")).encode()
DEEP = etcd_key(gnp_key("deep")).encode()
DUPLICATE = etcd_key(gnp_key("dup")).encode()
HUGE = etcd_key(gnp_key("huge")).encode()
DIGITS = etcd_key(gnp_key("digits")).encode()

DEPTH = 200_000


def _deep_value() -> bytes:
    return (b'{"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy", '
            b'"metadata": {"name": "deep"}, "spec": {"ingress": '
            + b"[" * DEPTH + b"]" * DEPTH + b"}}")


def _seed() -> FakeEtcd:
    fake = FakeEtcd()
    fake.put(GOOD, encode_value(gnp("good")))
    fake.put(DEEP, _deep_value())
    fake.put(DUPLICATE, b'{"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",'
                        b' "metadata": {"name": "dup"}, "spec": {"ingress": [{"action": "Deny",'
                        b' "action": "Allow"}]}}')
    huge = gnp("huge")
    huge["metadata"]["annotations"] = {"blob": "x" * (3 * 1024 * 1024)}
    fake.put(HUGE, encode_value(huge))
    fake.put(DIGITS, encode_value(gnp("digits"))[:-2] + b', "order": ' + b"9" * 5000 + b"}}")
    return fake


def test_each_hostile_value_is_rejected_alone_and_reported_once() -> None:
    fake = _seed()
    syncer, recorder = _syncer(fake)
    before = _parse_errors()
    syncer._list()  # used to raise RecursionError
    assert set(recorder.state) == {gnp_key("good")}
    by_source = {e.source: e.message for e in recorder.errors}
    assert sorted(by_source) == sorted(k.decode() for k in (DEEP, DUPLICATE, HUGE, DIGITS))
    assert "GlobalNetworkPolicy(deep): spec.ingress" in by_source[DEEP.decode()]
    assert "max_nesting_depth" in by_source[DEEP.decode()]
    assert "GlobalNetworkPolicy(dup): spec.ingress[0].action" in by_source[DUPLICATE.decode()]
    assert "max_document_bytes" in by_source[HUGE.decode()]
    assert "GlobalNetworkPolicy(digits): spec.order" in by_source[DIGITS.decode()]
    assert _parse_errors() - before == 4
    syncer._listed = False
    syncer._list()  # unchanged: not reported again
    assert _parse_errors() - before == 4


def test_a_good_value_turning_hostile_is_a_delete_and_back_again() -> None:
    fake = FakeEtcd()
    fake.put(GOOD, encode_value(gnp("good")))
    syncer, recorder = _syncer(fake)
    syncer._list()
    assert gnp_key("good") in recorder.state
    hostile = encode_value(gnp("good"))[:-2] + b', "selector": "x"}}'  # two selectors
    syncer._handle(_response(fake.put(GOOD, hostile)), None)
    assert gnp_key("good") not in recorder.state
    assert "spec.selector" in recorder.errors[-1].message
    syncer._handle(_response(fake.put(GOOD, encode_value(gnp("good")))), None)
    assert gnp_key("good") in recorder.state


def test_decode_value_names_key_resource_and_field() -> None:
    try:
        decode_value(DEEP.decode(), gnp_key("deep"), _deep_value())
    except ValueError as exc:
        message = str(exc)
    else:
        raise AssertionError("accepted a 200,000-deep value")
    assert message.startswith(f"etcd key {DEEP.decode()}: ")
    assert "GlobalNetworkPolicy(deep): spec.ingress[0]" in message
