"""Secrets in the Kubernetes datastore: confd's syncer ("bgp") lists and watches them in the
secret namespace only; the agent's ("felix") never asks for them."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from pyfelix.agent.datastore import parse_datastore_url
from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.agent.syncer.kube_resources import resource_types
from pyfelix.confd.datastore import read_once
from pyfelix.confd.render import render_from_updates
from tests.fakes_kube.server import FakeKubeAPIServer


def _secret(name: str, namespace: str, value: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "data": {"pw": base64.b64encode(value.encode()).decode()}}


def test_bgp_syncer_reads_secrets_of_its_namespace_only(
        fake_kube: FakeKubeAPIServer, start_kube_syncer: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAMESPACE", "calico-system")
    fake_kube.cluster.put_object(_secret("bgp-secrets", "calico-system", "one"))
    fake_kube.cluster.put_object(_secret("bgp-secrets", "default", "other"))
    _syncer, recorder = start_kube_syncer(resource_types=resource_types("bgp"))
    recorder.wait_in_sync()
    ours = ResourceKey("Secret", "calico-system", "bgp-secrets")
    assert ours in recorder.state
    assert ResourceKey("Secret", "default", "bgp-secrets") not in recorder.state
    fake_kube.cluster.put_object(_secret("bgp-secrets", "calico-system", "two"))
    recorder.wait_for(lambda r: r.state[ours]["data"]["pw"] == "dHdv", "secret changed")
    secret_paths = {path for _m, path, _q in fake_kube.requests if "secrets" in path}
    assert secret_paths == {"/api/v1/namespaces/calico-system/secrets"}


def test_felix_syncer_never_asks_for_secrets(
        fake_kube: FakeKubeAPIServer, start_kube_syncer: Any) -> None:
    fake_kube.cluster.put_object(_secret("bgp-secrets", "kube-system", "one"))
    _syncer, recorder = start_kube_syncer(resource_types=resource_types("felix"))
    recorder.wait_in_sync()
    assert not [k for k in recorder.state if k.kind == "Secret"]
    assert not [path for _m, path, _q in fake_kube.requests if "secrets" in path]


def test_confd_render_over_kubernetes_resolves_the_secret(
        fake_kube: FakeKubeAPIServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Kubernetes datastore end to end for confd: Calico CRDs for the Node and BGPPeer,
    the v1 Secret in $NAMESPACE; a same-named Secret elsewhere is not read."""
    monkeypatch.setenv("KUBECONFIG", fake_kube.write_kubeconfig(str(tmp_path / "kubeconfig")))
    monkeypatch.setenv("NAMESPACE", "calico-system")
    crd = "crd.projectcalico.org/v1"
    fake_kube.cluster.put_object({"apiVersion": crd, "kind": "BGPPeer",
                                  "metadata": {"name": "tor"},
                                  "spec": {"peerIP": "198.19.0.1", "asNumber": 65001,
                                           "password": {"secretKeyRef": {
                                               "name": "bgp-secrets", "key": "pw"}}}})
    fake_kube.cluster.put_object({"apiVersion": "v1", "kind": "Node",
                                  "metadata": {"name": "node1", "annotations": {
                                      "projectcalico.org/IPv4Address": "198.18.0.1/15"}}})
    fake_kube.cluster.put_object(_secret("bgp-secrets", "calico-system", "kube-pw"))
    fake_kube.cluster.put_object(_secret("bgp-secrets", "default", "wrong-pw"))
    updates, errors = read_once(parse_datastore_url("kubernetes"), timeout=20)
    assert errors == []
    text, _config = render_from_updates(updates, "node1")
    assert 'password "kube-pw";' in text
    assert "wrong-pw" not in text
