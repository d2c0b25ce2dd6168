"""The per-kind input limits the model enforces (README "Input limits"): rules per policy,
selector length, selector text per policy, members per set; and documents built in code
(not decoded) that are nested too deeply are a ValidationError, not a RecursionError.

Each limit is checked BEFORE the expensive part (parsing rules, compiling selectors), so a
rejected document costs little; the errors name resource, field and limit.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from pyfelix.agent.model import ValidationError, parse_resource
from pyfelix.agent.syncer.api import RawUpdate, key_of
from pyfelix.agent.validator import Validator
from tests.model.examples import by_kind

CALICO = "projectcalico.org/v3"
# The documented defaults (README "Input limits"; agent.inputs.LIMITS), written out so this
# file also runs against code without the limits.
MAX_RULES_PER_POLICY = 5_000
MAX_SELECTOR_LENGTH = 16_384
MAX_SET_MEMBERS = 100_000


def gnp(spec: dict[str, Any], name: str = "p") -> dict[str, Any]:
    return {"apiVersion": CALICO, "kind": "GlobalNetworkPolicy", "metadata": {"name": name},
            "spec": spec}


def rejected(doc: dict[str, Any]) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        parse_resource(doc)
    return caught.value


def test_rules_per_policy() -> None:
    rule = {"action": "Allow", "protocol": "TCP", "destination": {"ports": [80]}}
    limit = MAX_RULES_PER_POLICY
    parse_resource(gnp({"ingress": [rule] * (limit // 2), "egress": [rule] * (limit // 2)}))
    started = time.monotonic()
    error = rejected(gnp({"ingress": [rule] * limit, "egress": [rule]}))
    assert time.monotonic() - started < 0.5  # refused before parsing 5,001 rules
    assert error.resource == "GlobalNetworkPolicy(p)" and error.field == "spec.ingress"
    assert f"{limit + 1} rules" in error.message and "max_rules_per_policy" in error.message

    profile = {"apiVersion": CALICO, "kind": "Profile", "metadata": {"name": "pr"},
               "spec": {"egress": [{"action": "Allow"}] * (limit + 1)}}
    assert "max_rules_per_policy" in rejected(profile).message


def test_kubernetes_policy_rules_count_once_per_peer() -> None:
    doc = by_kind("KubernetesNetworkPolicy")
    peers = [{"ipBlock": {"cidr": f"10.{i // 256}.{i % 256}.0/24"}} for i in range(2_600)]
    doc["spec"]["ingress"] = [{"from": peers}, {"from": peers}]
    error = rejected(doc)
    assert error.field == "spec.ingress" and "max_rules_per_policy" in error.message
    doc["spec"]["ingress"] = [{"from": peers[:1000]}]
    parse_resource(doc)


def test_selector_length() -> None:
    limit = MAX_SELECTOR_LENGTH
    term = "k == 'v' || "
    fits = (term * (limit // len(term)))[: -len(" || ")]
    parse_resource(gnp({"selector": fits}))
    too_long = fits + " || a == 'b'"
    assert len(too_long) > limit
    error = rejected(gnp({"selector": too_long}))
    assert error.field == "spec.selector" and "max_selector_length (16384)" in error.message
    rule = {"action": "Allow", "source": {"notSelector": too_long}}
    error = rejected(gnp({"ingress": [rule]}))
    assert error.field == "spec.ingress[0].source.notSelector"
    pool = by_kind("IPPool", "pods-v4")
    pool["spec"]["nodeSelector"] = too_long
    assert rejected(pool).field == "spec.nodeSelector"


def test_selector_text_per_policy() -> None:
    selector = " || ".join(f"k{i} == 'v'" for i in range(1_000))[:15_000].rsplit(" ||", 1)[0]
    rules = [{"action": "Allow", "source": {"selector": f"{selector} || z == '{i}'"}}
             for i in range(10)]
    error = rejected(gnp({"ingress": rules}))
    assert error.field == "spec" and "max_selector_text_per_policy" in error.message
    # the same selector ten times is parsed once: it counts once
    same = [{"action": "Allow", "source": {"selector": selector}}] * 10
    parse_resource(gnp({"ingress": same}))


def test_kubernetes_label_selector_becomes_a_selector_within_the_limit() -> None:
    doc = by_kind("KubernetesNetworkPolicy")
    values = [f"value-{i}" for i in range(2_000)]
    doc["spec"]["podSelector"] = {"matchExpressions": [{"key": "app", "operator": "In",
                                                        "values": values}]}
    error = rejected(doc)
    assert error.field == "spec.podSelector" and "max_selector_length" in error.message
    doc["spec"]["podSelector"]["matchExpressions"][0]["values"] = values[:500]
    parse_resource(doc)


def test_members_per_set() -> None:
    limit = MAX_SET_MEMBERS
    doc = by_kind("GlobalNetworkSet")
    doc["spec"]["nets"] = ["10.0.0.1"] * (limit + 1)
    started = time.monotonic()
    error = rejected(doc)
    assert time.monotonic() - started < 0.5
    assert error.field == "spec.nets" and "max_set_members (100000)" in error.message
    doc = by_kind("GlobalNetworkSet")
    doc["metadata"]["labels"] = {f"k{i}": "v" for i in range(limit + 1)}
    assert rejected(doc).field == "metadata.labels"


def test_a_deeply_nested_document_built_in_code_is_a_validation_error() -> None:
    deep: Any = "x"
    for _ in range(5_000):
        deep = [deep]
    config = by_kind("FelixConfiguration")
    config["spec"]["bpfEnabled"] = deep  # free-form: serialised as JSON
    error = rejected(config)
    assert "nested too deeply" in error.message
    policy = by_kind("GlobalNetworkPolicy", "host-protect")
    policy["spec"]["selector"] = deep
    assert rejected(policy).field == "spec.selector"  # and the message is bounded
    assert len(str(rejected(policy))) < 400

    validator = Validator()
    [update] = validator.on_updates([RawUpdate(key_of(config), config)])
    assert update.value is None and "nested too deeply" in validator.errors[key_of(config)]
