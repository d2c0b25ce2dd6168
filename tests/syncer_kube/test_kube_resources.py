"""Unit tests for the Kubernetes resource table and object <-> document conversions."""

from __future__ import annotations

import pytest

from pyfelix.agent.kinds import KIND_K8S_NETWORK_POLICY
from pyfelix.agent.syncer.api import key_of
from pyfelix.agent.syncer.kube_resources import (
    CRD_TYPES,
    KUBERNETES_TYPES,
    RESOURCE_TYPES,
    ResourceType,
    crd_type,
    resource_types,
    to_crd_object,
    to_document,
)


def _type(plural: str, group_version: str) -> ResourceType:
    return next(t for t in RESOURCE_TYPES if t.plural == plural
                and t.group_version == group_version)


def test_paths_follow_the_api_layout() -> None:
    pods = _type("pods", "v1")
    assert pods.collection_path() == "/api/v1/pods"
    assert pods.collection_path("shop") == "/api/v1/namespaces/shop/pods"
    assert pods.object_path("shop", "web") == "/api/v1/namespaces/shop/pods/web"
    pools = _type("ippools", "crd.projectcalico.org/v1")
    assert pools.object_path("", "p") == "/apis/crd.projectcalico.org/v1/ippools/p"
    assert pools.collection_path("ignored") == "/apis/crd.projectcalico.org/v1/ippools"
    knp = _type("networkpolicies", "networking.k8s.io/v1")
    assert knp.kind == KIND_K8S_NETWORK_POLICY
    assert str(knp) == "networkpolicies.networking.k8s.io" and str(pods) == "pods"


def test_every_type_converts_to_a_document_keyed_as_its_kind() -> None:
    for rtype in RESOURCE_TYPES:
        obj = {"metadata": {"name": "x", "namespace": "ns", "resourceVersion": "5",
                            "managedFields": [{}]}, "spec": {}}
        doc = to_document(rtype, obj)
        key = key_of(doc)
        assert key.kind == rtype.kind
        assert key.namespace == ("ns" if rtype.namespaced else "")
        assert "managedFields" not in doc["metadata"]
    assert {t.kind for t in KUBERNETES_TYPES} == {
        "Pod", "Namespace", "ServiceAccount", "Node", KIND_K8S_NETWORK_POLICY, "Service",
        "EndpointSlice", "Secret"}


def test_secrets_are_read_by_confd_only_and_in_one_namespace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's Kubernetes syncer never lists Secrets; confd's lists them in $NAMESPACE
    (else kube-system), as calico-node does, never cluster-wide."""
    felix = resource_types("felix")
    assert "Secret" not in {t.kind for t in felix}
    assert {t.kind for t in felix} == {t.kind for t in RESOURCE_TYPES} - {"Secret"}
    monkeypatch.delenv("NAMESPACE", raising=False)
    (secrets,) = [t for t in resource_types("bgp") if t.kind == "Secret"]
    assert secrets.collection_path() == "/api/v1/namespaces/kube-system/secrets"
    monkeypatch.setenv("NAMESPACE", "calico-system")
    (secrets,) = [t for t in resource_types("bgp") if t.kind == "Secret"]
    assert secrets.collection_path() == "/api/v1/namespaces/calico-system/secrets"
    assert all(t.namespace is None for t in resource_types("bgp") if t.kind != "Secret")


def test_crd_documents_round_trip_and_drop_calico_bookkeeping() -> None:
    doc = {"apiVersion": "projectcalico.org/v3", "kind": "NetworkSet",
           "metadata": {"name": "db", "namespace": "shop", "labels": {"role": "db"},
                        "annotations": {"a": "b"}},
           "spec": {"nets": ["10.0.0.0/8"]}}
    rtype = crd_type("NetworkSet")
    assert rtype is not None and rtype in CRD_TYPES
    obj = to_crd_object(doc)
    assert obj["apiVersion"] == "crd.projectcalico.org/v1"
    obj["metadata"]["annotations"]["projectcalico.org/metadata"] = '{"generation": 2}'
    obj["metadata"]["uid"] = "u"
    assert to_document(rtype, obj) == doc
    assert crd_type("Pod") is None and crd_type("Profile") is None
