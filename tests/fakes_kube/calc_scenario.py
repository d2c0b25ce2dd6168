"""A small cluster, written once, used to check that every datastore gives the same
`pyfelix calc` result: the file datastore (reference), etcd and Kubernetes.

Only kinds every backend can hold: Calico CRD kinds (policies, network sets, an IP pool)
and Kubernetes' own (namespaces, service accounts, pods on two nodes, a NetworkPolicy).
`write_file_datastore(directory)` writes it as the reference file datastore;
`calc_summary(syncer, hostname)` runs a started-to-in-sync pipeline over any syncer, as
`agent.calc.snapshot.compute` does for non-file datastores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyfelix.agent.calc.expected_dataplane import ExpectedDataplane
from pyfelix.agent.calc.pipeline import CalcPipeline
from pyfelix.agent.syncer.api import Syncer

HOSTNAME = "node-a"

SCENARIO_YAML = """\
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: shop}}
---
apiVersion: v1
kind: Namespace
metadata: {name: admin, labels: {team: admin}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: web-sa, namespace: shop, labels: {tier: front}}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: pods}
spec: {cidr: 10.65.0.0/16}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: allow-admin}
spec:
  order: 10
  selector: "app in {'web', 'db'}"
  ingress:
  - action: Allow
    protocol: TCP
    source: {namespaceSelector: "team == 'admin'"}
    destination: {ports: [http]}
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: db-from-web, namespace: shop}
spec:
  order: 20
  selector: "app == 'db'"
  ingress:
  - action: Allow
    source: {selector: "app == 'web'"}
  - action: Allow
    source: {selector: "role == 'backup'"}
---
apiVersion: projectcalico.org/v3
kind: NetworkSet
metadata: {name: backups, namespace: shop, labels: {role: backup}}
spec: {nets: [192.0.2.0/28]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-ingress, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{protocol: TCP, port: 8080}]
"""


def _pod(name: str, namespace: str, node: str, ip: str, app: str,
         port: int | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "example"}
    if port is not None:
        container["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
            "spec": {"nodeName": node, "serviceAccountName": "web-sa" if app == "web" else
                     "default", "containers": [container]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


PODS = (
    _pod("web-1", "shop", "node-a", "10.65.0.1", "web", 8080),
    _pod("web-2", "shop", "node-b", "10.65.1.1", "web", 8080),
    _pod("db-1", "shop", "node-a", "10.65.0.2", "db", 5432),
    _pod("client-1", "shop", "node-b", "10.65.1.2", "client"),
    _pod("console", "admin", "node-b", "10.65.1.3", "console"),
)


def write_file_datastore(directory: Path) -> Path:
    """The scenario as a file datastore: `directory/resources` holding cluster.yaml (the
    documents of SCENARIO_YAML) and pods.json (PODS)."""
    resources = directory / "resources"
    resources.mkdir()
    (resources / "cluster.yaml").write_text(SCENARIO_YAML)
    (resources / "pods.json").write_text("\n".join(json.dumps(p) for p in PODS))
    return resources


def calc_summary(syncer: Syncer, hostname: str = HOSTNAME,
                 timeout: float = 30.0) -> dict[str, Any]:
    """The `pyfelix calc -o json` object for `hostname`, from a not-yet-started syncer."""
    state = ExpectedDataplane(strict=False)
    state.record = False
    pipeline = CalcPipeline(hostname, state)
    pipeline.start()
    syncer.start(pipeline)
    try:
        if not pipeline.wait_in_sync(timeout):
            raise AssertionError(f"no in-sync within {timeout} s")
    finally:
        syncer.stop()
        pipeline.stop()
    assert pipeline.errors == [], pipeline.errors
    assert pipeline.validator.errors == {}, pipeline.validator.errors
    return state.summary()
