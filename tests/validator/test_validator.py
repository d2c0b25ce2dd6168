"""The validator stage: raw updates in, typed Calico-keyed updates out, bad input -> delete."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pyfelix.agent.model import (
    NetworkPolicy,
    Node,
    Profile,
    ValidationError,
    WorkloadEndpoint,
)
from pyfelix.agent.syncer.api import RawUpdate, ResourceKey, key_of
from pyfelix.agent.validator import ValidatedUpdate, Validator, validate_document
from tests.model.examples import by_kind

POD_WEP = ResourceKey("WorkloadEndpoint", "prod", "node1-k8s-api--7d9f8--abcde-eth0")


def errors_counted(kind: str) -> float:
    return REGISTRY.get_sample_value("pyfelix_validation_errors_total", {"kind": kind}) or 0.0


def put(validator: Validator, doc: dict[str, Any], source: str = "test.yaml#1"
        ) -> list[ValidatedUpdate]:
    return validator.on_updates([RawUpdate(key_of(doc), doc, source)])


def delete(validator: Validator, key: ResourceKey) -> list[ValidatedUpdate]:
    return validator.on_updates([RawUpdate(key, None, "test.yaml#1")])


def state(updates: list[ValidatedUpdate]) -> dict[ResourceKey, str | None]:
    """Each emitted key -> the kind of its new value (None for a delete)."""
    return {u.key: None if u.value is None else type(u.value).__name__ for u in updates}


def test_valid_calico_resource_passes_through() -> None:
    validator = Validator()
    doc = by_kind("GlobalNetworkPolicy", "host-protect")
    (update,) = put(validator, doc, "policies.yaml#3")
    assert update.key == key_of(doc) and isinstance(update.value, NetworkPolicy)
    assert update.source == "policies.yaml#3"


def test_invalid_document_becomes_a_counted_logged_delete(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    validator = Validator()
    good = by_kind("GlobalNetworkPolicy", "host-protect")
    put(validator, good)
    bad = by_kind("GlobalNetworkPolicy", "host-protect")
    bad["spec"]["ingress"][0]["action"] = "Accept"
    before = errors_counted("GlobalNetworkPolicy")
    with caplog.at_level(logging.WARNING, logger="pyfelix.agent.validator"):
        updates = put(validator, bad, "policies.yaml#2")
    assert updates == [ValidatedUpdate(key_of(bad), None, "policies.yaml#2")]
    assert errors_counted("GlobalNetworkPolicy") == before + 1
    # the validator's own record (a metrics scrape may log from elsewhere meanwhile)
    message = [r for r in caplog.records if r.name == "pyfelix.agent.validator"][-1].getMessage()
    assert "GlobalNetworkPolicy(host-protect)" in message
    assert "spec.ingress[0].action" in message and "policies.yaml#2" in message
    assert "spec.ingress[0].action" in validator.errors[key_of(bad)]


def test_invalid_document_never_seen_is_still_a_delete_of_its_key() -> None:
    validator = Validator()
    bad = by_kind("IPPool", "pods-v4")
    bad["spec"]["cidr"] = "not-a-cidr"
    assert put(validator, bad) == [ValidatedUpdate(key_of(bad), None, "test.yaml#1")]


def test_fixing_an_invalid_document_restores_it_and_clears_the_error() -> None:
    validator = Validator()
    bad = by_kind("Tier")
    bad["spec"]["defaultAction"] = "Allow"
    put(validator, bad)
    assert key_of(bad) in validator.errors
    (update,) = put(validator, by_kind("Tier"))
    assert update.value is not None and key_of(bad) not in validator.errors


def test_unknown_kinds_are_counted_under_one_label() -> None:
    validator = Validator()
    before = errors_counted("unknown")
    doc = {"apiVersion": "projectcalico.org/v3", "kind": "Gizmo", "metadata": {"name": "g"}}
    assert state(put(validator, doc)) == {ResourceKey("Gizmo", "", "g"): None}
    assert errors_counted("unknown") == before + 1


def test_pod_add_and_delete_produce_the_workload_endpoint_key() -> None:
    validator = Validator()
    pod = by_kind("Pod")
    (added,) = put(validator, pod)
    assert added.key == POD_WEP and isinstance(added.value, WorkloadEndpoint)
    assert validator.outputs_of(key_of(pod)) == {POD_WEP: added.value}
    assert delete(validator, key_of(pod)) == [ValidatedUpdate(POD_WEP, None, "test.yaml#1")]
    assert validator.outputs_of(key_of(pod)) == {}


@pytest.mark.parametrize("change", [
    lambda pod: pod["status"].update(podIPs=None, podIP=None),
    lambda pod: pod["spec"].update(hostNetwork=True),
    lambda pod: pod["status"].update(phase="Succeeded"),
    lambda pod: pod["metadata"].update(deletionTimestamp="2024-05-01T10:00:00Z"),
], ids=["loses-ip", "host-network", "succeeded", "terminating"])
def test_pod_that_stops_having_an_endpoint_deletes_it(change: Any) -> None:
    validator = Validator()
    pod = by_kind("Pod")
    put(validator, pod)
    change(pod)
    assert state(put(validator, pod)) == {POD_WEP: None}
    # and a repeat of the same state emits nothing new
    assert put(validator, pod) == []


def test_pod_that_becomes_invalid_deletes_its_endpoint() -> None:
    validator = Validator()
    pod = by_kind("Pod")
    put(validator, pod)
    pod["status"]["podIPs"] = [{"ip": "garbage"}]
    before = errors_counted("Pod")
    assert state(put(validator, pod)) == {POD_WEP: None}
    assert errors_counted("Pod") == before + 1


def test_pod_moving_node_replaces_its_endpoint() -> None:
    validator = Validator()
    pod = by_kind("Pod")
    put(validator, pod)
    pod["spec"]["nodeName"] = "node2"
    moved = ResourceKey("WorkloadEndpoint", "prod", "node2-k8s-api--7d9f8--abcde-eth0")
    assert state(put(validator, pod)) == {moved: "WorkloadEndpoint", POD_WEP: None}


def test_kubernetes_kinds_are_keyed_by_their_calico_keys() -> None:
    validator = Validator()
    out = state(put(validator, by_kind("Namespace")) + put(validator, by_kind("ServiceAccount"))
                + put(validator, by_kind("KubernetesNetworkPolicy")))
    assert out == {ResourceKey("Profile", "", "kns.prod"): "Profile",
                   ResourceKey("Profile", "", "ksa.prod.api"): "Profile",
                   ResourceKey("NetworkPolicy", "db", "knp.default.db-from-web"):
                       "NetworkPolicy"}
    assert state(delete(validator, ResourceKey("Namespace", "", "prod"))) == {
        ResourceKey("Profile", "", "kns.prod"): None}


def test_invalid_kubernetes_policy_deletes_its_converted_key() -> None:
    validator = Validator()
    doc = by_kind("KubernetesNetworkPolicy")
    doc["spec"]["policyTypes"] = ["Sideways"]
    assert state(put(validator, doc)) == {
        ResourceKey("NetworkPolicy", "db", "knp.default.db-from-web"): None}


def test_kubernetes_node_passes_through_as_a_model_node() -> None:
    validator = Validator()
    (update,) = put(validator, by_kind("Node", "node2"))
    assert update.key == ResourceKey("Node", "", "node2") and isinstance(update.value, Node)
    assert update.value.addresses == ("198.18.0.2",)


def test_two_sources_of_one_key_most_recent_wins_and_the_other_comes_back() -> None:
    validator = Validator()
    pod = by_kind("Pod")
    put(validator, pod)
    wep_doc = by_kind("WorkloadEndpoint")
    wep_doc["metadata"]["name"] = POD_WEP.name
    (update,) = put(validator, wep_doc)
    assert update.key == POD_WEP and isinstance(update.value, WorkloadEndpoint)
    assert update.value.interface_name == "cali0123456789a"  # the Calico document's
    (restored,) = delete(validator, POD_WEP)
    assert restored.key == POD_WEP and isinstance(restored.value, WorkloadEndpoint)
    assert restored.value.interface_name == "cali1fc0ca3ecf5"  # the pod's again
    assert state(delete(validator, key_of(pod))) == {POD_WEP: None}


def test_document_whose_key_disagrees_with_the_update_key_is_rejected() -> None:
    validator = Validator()
    doc = by_kind("Tier")
    updates = validator.on_updates([RawUpdate(ResourceKey("Tier", "", "other"), doc, "x")])
    assert state(updates) == {ResourceKey("Tier", "", "other"): None}


def test_batches_keep_order() -> None:
    validator = Validator()
    ns, tier = by_kind("Namespace"), by_kind("Tier")
    out = validator.on_updates([RawUpdate(key_of(ns), ns), RawUpdate(key_of(tier), tier),
                                RawUpdate(key_of(ns), None)])
    assert [(u.key.name, u.value is None) for u in out] == [
        ("kns.prod", False), ("security", False), ("kns.prod", True)]


def test_validate_document_for_apply() -> None:
    profile = validate_document(by_kind("Profile"))
    assert isinstance(profile, Profile) and profile.labels_to_apply == (("zone", "dc1"),)
    bad = by_kind("Profile")
    bad["spec"]["labelsToApply"] = {"zone": "a b"}
    with pytest.raises(ValidationError) as err:
        validate_document(bad)
    assert err.value.field == "spec.labelsToApply.zone"


def test_interface_prefix_too_long_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="too long"):
        Validator(interface_prefix="toolongprefix")
    validator = Validator(interface_prefix="tap")
    (update,) = put(validator, by_kind("Pod"))
    assert isinstance(update.value, WorkloadEndpoint)
    assert update.value.interface_name.startswith("tap")


def test_secrets_are_dropped_unparsed_by_the_agent(caplog: pytest.LogCaptureFixture) -> None:
    """BGP password Secrets are confd's: the agent's validator emits nothing for them, valid
    or not, logs nothing about them and counts nothing (it never parses a secret)."""
    validator = Validator()
    good = by_kind("Secret")
    bad = by_kind("Secret")
    bad["data"] = {"pw": "not base64 s3cr3t!"}
    before = errors_counted("Secret")
    with caplog.at_level(logging.DEBUG, logger="pyfelix.agent.validator"):
        assert put(validator, good) == []
        assert put(validator, bad) == []
        assert delete(validator, key_of(good)) == []
    assert errors_counted("Secret") == before
    assert not [r for r in caplog.records if r.name == "pyfelix.agent.validator"]
    assert validator.errors == {}


def test_bgp_filter_errors_are_counted_by_the_agent_too() -> None:
    validator = Validator()
    bad = by_kind("BGPFilter")
    bad["spec"]["importV4"][0]["matchOperator"] = "Around"
    before = errors_counted("BGPFilter")
    assert put(validator, bad) == [ValidatedUpdate(key_of(bad), None, "test.yaml#1")]
    assert errors_counted("BGPFilter") == before + 1
    assert "spec.importV4[0].matchOperator" in validator.errors[key_of(bad)]
