"""Calico's selector semantics for policies and rule entities (namespaces, service accounts)."""

from __future__ import annotations

from typing import Any

import pytest

from pyfelix.agent import selector
from pyfelix.agent.model import (
    EntityRule,
    NetworkPolicy,
    ServiceAccountMatch,
    entity_selector,
    inherited_labels,
    parse_resource,
    policy_selector,
)

# An endpoint's labels as the calc graph sees them: own labels plus inherited profile labels.
POD_PROD_WEB = inherited_labels(
    {"app": "web", "projectcalico.org/namespace": "prod",
     "projectcalico.org/orchestrator": "k8s", "projectcalico.org/serviceaccount": "web-sa"},
    [{"pcns.env": "prod", "pcns.projectcalico.org/name": "prod"},
     {"pcsa.team": "fe", "pcsa.projectcalico.org/name": "web-sa"}])
POD_DEV_WEB = inherited_labels(
    {"app": "web", "projectcalico.org/namespace": "dev", "projectcalico.org/orchestrator": "k8s"},
    [{"pcns.env": "dev", "pcns.projectcalico.org/name": "dev"}])
HOST_ENDPOINT = {"app": "web", "host": "true"}


def matches(text: str, labels: dict[str, str]) -> bool:
    return selector.parse(text).evaluate(labels)


def test_inherited_labels_own_labels_win_then_earlier_profiles() -> None:
    labels = inherited_labels({"a": "own"}, [{"a": "p1", "b": "p1"}, {"b": "p2", "c": "p2"}])
    assert labels == {"a": "own", "b": "p1", "c": "p2"}


def test_selector_in_a_namespaced_policy_is_limited_to_its_namespace() -> None:
    text = entity_selector(EntityRule(selector="app == 'web'"), "prod")
    assert matches(text, POD_PROD_WEB)
    assert not matches(text, POD_DEV_WEB)
    assert not matches(text, HOST_ENDPOINT)


def test_selector_in_a_global_policy_is_not_limited() -> None:
    text = entity_selector(EntityRule(selector="app == 'web'"), "")
    assert all(matches(text, labels) for labels in (POD_PROD_WEB, POD_DEV_WEB, HOST_ENDPOINT))


def test_namespace_selector_reads_the_inherited_namespace_labels() -> None:
    text = entity_selector(EntityRule(namespace_selector="env == 'dev'"), "prod")
    assert "pcns.env" in text
    assert matches(text, POD_DEV_WEB) and not matches(text, POD_PROD_WEB)
    by_name = entity_selector(EntityRule(namespace_selector="projectcalico.org/name == 'prod'"))
    assert matches(by_name, POD_PROD_WEB) and not matches(by_name, POD_DEV_WEB)


@pytest.mark.parametrize("namespace", ["", "prod"])
def test_namespace_selector_all_means_any_namespaced_endpoint(namespace: str) -> None:
    text = entity_selector(EntityRule(namespace_selector="all()"), namespace)
    assert text == "has(projectcalico.org/namespace)"
    assert matches(text, POD_PROD_WEB) and matches(text, POD_DEV_WEB)
    assert not matches(text, HOST_ENDPOINT)


def test_namespace_selector_global_means_not_namespaced() -> None:
    text = entity_selector(EntityRule(namespace_selector="global()"), "prod")
    assert matches(text, HOST_ENDPOINT) and not matches(text, POD_PROD_WEB)


def test_namespace_and_pod_selectors_are_anded() -> None:
    text = entity_selector(EntityRule(selector="app == 'web'", namespace_selector="env == 'prod'"),
                           "dev")
    assert matches(text, POD_PROD_WEB) and not matches(text, POD_DEV_WEB)
    assert not matches(text, {**POD_PROD_WEB, "app": "db"})


def test_not_selector_alone_still_limits_to_the_namespace() -> None:
    entity = EntityRule(not_selector="app == 'db'")
    assert entity_selector(entity, "prod") == 'projectcalico.org/namespace == "prod"'
    assert entity_selector(entity, "") == ""


def test_nets_only_entity_has_no_selector() -> None:
    assert entity_selector(EntityRule(nets=("10.0.0.0/8",)), "prod") == ""


def test_service_accounts_by_name_and_by_label() -> None:
    by_name = entity_selector(EntityRule(service_accounts=ServiceAccountMatch(("web-sa",))),
                              "prod")
    assert matches(by_name, POD_PROD_WEB)
    assert not matches(by_name, {**POD_PROD_WEB, "projectcalico.org/serviceaccount": "x"})
    by_label = entity_selector(EntityRule(service_accounts=ServiceAccountMatch(
        selector="team == 'fe'")), "")
    assert "pcsa.team" in by_label and matches(by_label, POD_PROD_WEB)
    both = entity_selector(EntityRule(service_accounts=ServiceAccountMatch(
        ("other",), "team == 'fe'")), "")
    assert not matches(both, POD_PROD_WEB)


def test_prefixing_rewrites_keys_not_values() -> None:
    text = entity_selector(EntityRule(namespace_selector="env == 'has(x)' || has(team)"))
    assert 'pcns.env == "has(x)"' in text and "has(pcns.team)" in text


def policy(kind: str, spec: dict[str, Any], namespace: str = "prod") -> NetworkPolicy:
    meta: dict[str, Any] = {"name": "p"}
    if kind == "NetworkPolicy":
        meta["namespace"] = namespace
    parsed = parse_resource({"apiVersion": "projectcalico.org/v3", "kind": kind,
                             "metadata": meta, "spec": spec})
    assert isinstance(parsed, NetworkPolicy)
    return parsed


def test_namespaced_policy_applies_only_in_its_namespace() -> None:
    text = policy_selector(policy("NetworkPolicy", {"selector": "app == 'web'"}))
    assert matches(text, POD_PROD_WEB) and not matches(text, POD_DEV_WEB)
    everything = policy_selector(policy("NetworkPolicy", {}))
    assert matches(everything, POD_PROD_WEB) and not matches(everything, HOST_ENDPOINT)


def test_global_policy_namespace_and_service_account_selectors() -> None:
    plain = policy_selector(policy("GlobalNetworkPolicy", {"selector": "app == 'web'"}))
    assert all(matches(plain, labels) for labels in (POD_PROD_WEB, POD_DEV_WEB, HOST_ENDPOINT))
    in_dev = policy_selector(policy("GlobalNetworkPolicy", {"namespaceSelector": "env == 'dev'"}))
    assert matches(in_dev, POD_DEV_WEB) and not matches(in_dev, POD_PROD_WEB)
    all_ns = policy_selector(policy("GlobalNetworkPolicy", {"namespaceSelector": "all()"}))
    assert matches(all_ns, POD_DEV_WEB) and not matches(all_ns, HOST_ENDPOINT)
    by_sa = policy_selector(policy("GlobalNetworkPolicy",
                                   {"serviceAccountSelector": "team == 'fe'"}))
    assert matches(by_sa, POD_PROD_WEB) and not matches(by_sa, POD_DEV_WEB)
