"""The Kubernetes datastore client (apply/get/delete of Calico CRD kinds), against the
in-process fake API server of tests/fakes_kube (no kube-apiserver can be installed on the
test machines; the fake stores objects, versions them and answers 404/409/422 as the real
one does), and the round trip through the Kubernetes syncer.
"""

from __future__ import annotations

from typing import Any

import pytest

from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.agent.syncer.client import DatastoreClientError, InvalidResources, ResourceNotFound
from pyfelix.agent.syncer.kube_api import KubeAPI
from pyfelix.agent.syncer.kube_store import KubeDatastore
from tests.fakes_kube.server import FakeKubeAPIServer
from tests.syncer_kube.conftest import SyncerFactory

CALICO = "projectcalico.org/v3"


def gnp(name: str, selector: str = "all()") -> dict[str, Any]:
    return {"apiVersion": CALICO, "kind": "GlobalNetworkPolicy",
            "metadata": {"name": name, "labels": {"owner": "net"}},
            "spec": {"selector": selector, "order": 5}}


def netpol(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": CALICO, "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": "app == 'db'"}}


def _stored(fake: FakeKubeAPIServer, kind: str, name: str, namespace: str = "") -> Any:
    served = fake.cluster.find_type(kind, "crd.projectcalico.org/v1")
    return fake.cluster.get(served, namespace, name)


def test_apply_creates_replaces_and_skips_unchanged(fake_kube: FakeKubeAPIServer,
                                                    kube_api: KubeAPI) -> None:
    store = KubeDatastore(kube_api)
    results = store.apply([gnp("a"), netpol("db", "shop")])
    assert [r.action for r in results] == ["created", "created"]
    stored = _stored(fake_kube, "GlobalNetworkPolicy", "a")
    assert stored["apiVersion"] == "crd.projectcalico.org/v1"
    assert stored["metadata"]["labels"] == {"owner": "net"}
    assert stored["spec"] == {"selector": "all()", "order": 5}
    assert _stored(fake_kube, "NetworkPolicy", "db", "shop")["metadata"]["namespace"] == "shop"

    version = stored["metadata"]["resourceVersion"]
    assert store.apply([gnp("a")])[0].action == "unchanged"
    assert _stored(fake_kube, "GlobalNetworkPolicy", "a")["metadata"]["resourceVersion"] == version
    assert store.apply([gnp("a", selector="app == 'x'")])[0].action == "configured"
    assert _stored(fake_kube, "GlobalNetworkPolicy", "a")["spec"]["selector"] == "app == 'x'"
    # The replace was a PUT carrying the resourceVersion it read (the fake refuses others).
    puts = [path for method, path, _ in fake_kube.requests if method == "PUT"]
    assert puts == ["/apis/crd.projectcalico.org/v1/globalnetworkpolicies/a"]

    assert store.get("GlobalNetworkPolicy") == [gnp("a", selector="app == 'x'")]
    assert store.get("NetworkPolicy", namespace="shop") == [netpol("db", "shop")]
    assert store.get("NetworkPolicy", namespace="other") == []
    assert set(store.list()) == {ResourceKey("GlobalNetworkPolicy", "", "a"),
                                 ResourceKey("NetworkPolicy", "shop", "db")}


def test_apply_refuses_kubernetes_kinds_and_invalid_documents_writing_nothing(
        fake_kube: FakeKubeAPIServer, kube_api: KubeAPI) -> None:
    store = KubeDatastore(kube_api)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "x"}}
    nameless = {"apiVersion": CALICO, "kind": "IPPool", "metadata": {}}
    with pytest.raises(InvalidResources) as caught:
        store.apply([gnp("fine"), pod, nameless], sources=["a.yaml#1", "a.yaml#2", "a.yaml#3"])
    text = str(caught.value)
    assert "a.yaml#2: Pod(x/p): kind Pod cannot be written" in text and "kubectl" in text
    assert "a.yaml#3" in text and "metadata.name" in text
    assert [m for m, _, _ in fake_kube.requests if m != "GET"] == []
    assert store.list() == {}


def test_delete_and_errors(fake_kube: FakeKubeAPIServer, kube_api: KubeAPI) -> None:
    store = KubeDatastore(kube_api)
    store.apply([gnp("a"), gnp("b")])
    store.delete(ResourceKey("GlobalNetworkPolicy", "", "a"))
    assert [d["metadata"]["name"] for d in store.get("GlobalNetworkPolicy")] == ["b"]
    with pytest.raises(ResourceNotFound, match=r"GlobalNetworkPolicy\(a\) not found"):
        store.delete(ResourceKey("GlobalNetworkPolicy", "", "a"))
    with pytest.raises(DatastoreClientError, match="kubectl"):
        store.delete(ResourceKey("Pod", "x", "p"))
    with pytest.raises(DatastoreClientError, match="kubectl"):
        store.get("Namespace")


def test_what_apply_writes_the_syncer_reads_back(fake_kube: FakeKubeAPIServer,
                                                 kube_api: KubeAPI,
                                                 start_kube_syncer: SyncerFactory) -> None:
    store = KubeDatastore(kube_api)
    docs = [gnp("a"), netpol("db", "shop"),
            {"apiVersion": CALICO, "kind": "IPPool", "metadata": {"name": "pool"},
             "spec": {"cidr": "10.65.0.0/16", "natOutgoing": True}}]
    store.apply(docs)
    _, recorder = start_kube_syncer()
    recorder.wait_in_sync()
    assert sorted(recorder.state.values(), key=str) == sorted(docs, key=str)
    store.apply([gnp("late")])
    recorder.wait_for(lambda r: ResourceKey("GlobalNetworkPolicy", "", "late") in r.state,
                      "late")
    assert recorder.state[ResourceKey("GlobalNetworkPolicy", "", "late")] == gnp("late")


def test_factories_load_credentials_or_say_where_they_looked(
        fake_kube: FakeKubeAPIServer, tmp_path: Any) -> None:
    from pyfelix.agent.syncer.kube import KubeSyncer, make_kube_syncer
    from pyfelix.agent.syncer.kube_store import open_kube_datastore

    kubeconfig = fake_kube.write_kubeconfig(str(tmp_path / "kc"))
    assert isinstance(make_kube_syncer(kubeconfig=kubeconfig, page_size=10), KubeSyncer)
    store = open_kube_datastore(kubeconfig=kubeconfig)
    assert store.description == f"kubernetes datastore {fake_kube.url}"
    assert store.get("IPPool") == []
    with pytest.raises(DatastoreClientError, match="cannot load Kubernetes credentials from "
                                                   "/nowhere/kubeconfig"):
        make_kube_syncer(kubeconfig="/nowhere/kubeconfig")
