"""The lab datastore directory: one file per document, replace on re-apply, strict delete."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pyfelix.lab.datastore import LabDatastore, LabDatastoreError, topology_documents
from pyfelix.lab.scenario import ResourceRef, parse_scenario
from pyfelix.lab.topology import plan_topology


@pytest.fixture
def store(tmp_path: Path) -> LabDatastore:
    (tmp_path / "ds").mkdir()
    (tmp_path / "staging").mkdir()
    return LabDatastore(tmp_path / "ds", tmp_path / "staging")


def policy(name: str, order: int) -> dict[str, object]:
    return {"apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": "x"}, "spec": {"order": order}}


def test_apply_replaces_by_kind_namespace_name_and_delete_removes(store: LabDatastore) -> None:
    store.apply([policy("p", 1), policy("q", 2)])
    store.apply([policy("p", 5)])
    assert sorted((d["metadata"]["name"], d["spec"]["order"]) for d in store.documents()) == [
        ("p", 5), ("q", 2)]
    assert list(store.staging.iterdir()) == []
    store.delete([ResourceRef("NetworkPolicy", "p", "x")])
    assert [d["metadata"]["name"] for d in store.documents()] == ["q"]


def test_delete_of_something_never_applied_is_an_error(store: LabDatastore) -> None:
    store.apply([policy("p", 1)])
    with pytest.raises(LabDatastoreError, match="NetworkPolicy x/p2: it was never applied"):
        store.delete([ResourceRef("NetworkPolicy", "p2", "x")])
    with pytest.raises(LabDatastoreError, match="GlobalNetworkPolicy p"):
        store.delete([ResourceRef("GlobalNetworkPolicy", "p")])


def test_unsafe_characters_never_escape_the_directory(store: LabDatastore) -> None:
    path = store.file_for("Kind", "../../etc/x", "a/b")
    assert path.parent == store.directory


def test_topology_documents_describe_nodes_namespaces_and_pods() -> None:
    scenario = parse_scenario({
        "nodes": ["n1", "n2"],
        "namespaces": [{"name": "x", "labels": {"team": "x"}}],
        "pods": [{"namespace": "x", "name": "a", "node": "n2", "labels": {"app": "a"},
                  "ports": [{"port": 80, "name": "http"}, {"port": 53, "protocol": "UDP"}]}],
    })
    docs = topology_documents(scenario, plan_topology("pf000001", scenario))
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert set(by_kind) == {("Node", "n1"), ("Node", "n2"), ("Namespace", "x"), ("Pod", "a")}
    assert by_kind[("Node", "n2")]["spec"]["bgp"]["ipv4Address"] == "198.18.0.2/15"
    assert by_kind[("Namespace", "x")]["metadata"]["labels"] == {
        "kubernetes.io/metadata.name": "x", "team": "x"}
    pod = by_kind[("Pod", "a")]
    assert pod["spec"]["nodeName"] == "n2"
    assert pod["status"]["podIP"] == "10.65.0.1"
    assert pod["metadata"]["annotations"]["cni.projectcalico.org/podIP"] == "10.65.0.1/32"
    assert pod["spec"]["containers"][0]["ports"] == [
        {"containerPort": 80, "protocol": "TCP", "name": "http"},
        {"containerPort": 53, "protocol": "UDP"}]
    assert yaml.safe_load(yaml.safe_dump(docs)) == docs
