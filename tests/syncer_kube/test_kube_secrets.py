"""Secrets in the Kubernetes datastore: confd's syncer ("bgp") lists and watches them in the
secret namespace only; the agent's ("felix") never asks for them."""

from __future__ import annotations

from typing import Any

import pytest

from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.agent.syncer.kube_resources import resource_types
from tests.fakes_kube.server import FakeKubeAPIServer


def _secret(name: str, namespace: str, value: str) -> dict[str, Any]:
    import base64

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
