"""BGP passwords from a v1 Secret in a REAL etcd: `pyfelix apply` stores the Secret (as
kubectl takes it: data base64 and stringData) under Calico's key layout's kubernetes
directory, and `pyfelix confd render` over etcd3:// resolves the BGPPeer's secretKeyRef
from it; a Secret of the same name in another namespace is not used."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.cli.main import cli
from tests.privileged.etcd.etcd_server import EtcdServer
from tests.privileged.etcd.etcd_testlib import etcd_contents

pytestmark = pytest.mark.privileged

_RESOURCES = """\
apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node1}
spec: {bgp: {ipv4Address: 198.18.0.1/15}}
---
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata: {name: tor}
spec:
  peerIP: 198.19.0.1
  asNumber: 65001
  password: {secretKeyRef: {name: bgp-secrets, key: tor}}
---
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata: {name: tor2}
spec:
  peerIP: 198.19.0.2
  asNumber: 65001
  password: {secretKeyRef: {name: bgp-secrets, key: tor2}}
---
apiVersion: v1
kind: Secret
metadata: {name: bgp-secrets, namespace: calico-system}
type: Opaque
data: {tor: B64}
stringData: {tor2: etcd-string-pw}
---
apiVersion: v1
kind: Secret
metadata: {name: bgp-secrets, namespace: default}
stringData: {tor: not-this-one}
""".replace("B64", base64.b64encode(b"etcd-b64-pw").decode())


def test_secret_in_etcd_resolves_the_peer_password(etcd: EtcdServer, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"etcd3://{etcd.endpoint}"
    resources = tmp_path / "bgp.yaml"
    resources.write_text(_RESOURCES)
    runner = CliRunner()
    result = runner.invoke(cli, ["apply", "-f", str(resources), "--datastore", url])
    assert result.exit_code == 0, result.output
    assert "etcd-b64-pw" not in result.output and "etcd-string-pw" not in result.output
    stored = etcd_contents(etcd.writer_config())
    assert ResourceKey("Secret", "calico-system", "bgp-secrets") in stored

    monkeypatch.setenv("NAMESPACE", "calico-system")
    result = runner.invoke(cli, ["confd", "render", "--datastore", url, "--hostname", "node1",
                                 "--check"])
    assert result.exit_code == 0, result.output
    assert 'password "etcd-b64-pw";' in result.output
    assert 'password "etcd-string-pw";' in result.output
    assert "not-this-one" not in result.output

    monkeypatch.setenv("NAMESPACE", "default")  # only key `tor` there: tor2 is left out
    result = runner.invoke(cli, ["confd", "render", "--datastore", url, "--hostname", "node1"])
    assert result.exit_code == 0, result.output
    assert 'password "not-this-one";' in result.output
    assert "neighbor 198.19.0.2" not in result.output
    assert "Secret default/bgp-secrets has no key 'tor2'" in result.output
