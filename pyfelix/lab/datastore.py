"""The lab's file datastore: one directory of YAML documents the nodes' agents will read.

Role: what `kubectl apply` / `calicoctl apply` are to a real cluster. The lab writes the
topology as the cluster would hold it (Kubernetes Namespaces and Pods, Calico Nodes) and the
scenario's resources, one document per file; a step's `delete` removes a file. Agents started
with `--datastore <dir>` (the file backend, which watches the directory) see the changes.

Inputs: raw resource dicts (as in the scenario), `ResourceRef`s, the scenario + topology.
Outputs: files `<kind>.<namespace>.<name>.yaml` (`_` for cluster-scoped) in the directory.

Invariants:
- A file appears complete or not at all: it is written under the staging directory (same
  file system) and renamed into place, so a watcher never reads half a document.
- Applying a document with the same kind/namespace/name replaces the previous file; deleting
  something never applied is an error (`LabDatastoreError`) rather than a silent no-op.
- Documents are not validated here beyond kind and metadata.name; the agent's resource
  model reports bad ones, as it would for any datastore.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pyfelix.lab.scenario import ResourceRef, Scenario

if TYPE_CHECKING:
    from pyfelix.lab.topology import LabTopology

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
CALICO_API = "projectcalico.org/v3"
CALICO_POD_IP_ANNOTATION = "cni.projectcalico.org/podIP"
CALICO_POD_IPS_ANNOTATION = "cni.projectcalico.org/podIPs"
FLOATING_IPS_ANNOTATION = "cni.projectcalico.org/floatingIPs"
# cluster-wide kinds of the first step written with the topology, before any agent starts
START_KINDS = ("IPPool", "FelixConfiguration")
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


class LabDatastoreError(ValueError):
    pass


class LabDatastore:
    def __init__(self, directory: Path, staging: Path) -> None:
        self.directory = directory
        self.staging = staging

    def file_for(self, kind: str, name: str, namespace: str | None) -> Path:
        parts = [kind.lower(), namespace or "_", name]
        return self.directory / (".".join(_UNSAFE.sub("_", p) for p in parts) + ".yaml")

    def apply(self, documents: Iterable[Mapping[str, Any]]) -> list[Path]:
        written = []
        for doc in documents:
            metadata = doc.get("metadata") or {}
            path = self.file_for(str(doc["kind"]), str(metadata["name"]),
                                 metadata.get("namespace"))
            staged = self.staging / path.name
            staged.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
            os.replace(staged, path)
            written.append(path)
        return written

    def delete(self, refs: Iterable[ResourceRef]) -> list[Path]:
        removed = []
        for ref in refs:
            path = self.file_for(ref.kind, ref.name, ref.namespace)
            try:
                path.unlink()
            except FileNotFoundError:
                where = f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name
                raise LabDatastoreError(
                    f"cannot delete {ref.kind} {where}: it was never applied"
                ) from None
            removed.append(path)
        return removed

    def documents(self) -> list[dict[str, Any]]:
        """Every document currently in the directory (sorted by file name; a file may hold
        several, as benchmarks write them)."""
        return [doc for p in sorted(self.directory.glob("*.yaml"))
                for doc in yaml.safe_load_all(p.read_text()) if doc is not None]


def topology_documents(scenario: Scenario, topology: LabTopology) -> list[dict[str, Any]]:
    """The cluster state the scenario describes, as a real cluster's datastore holds it.

    The IP pools and FelixConfigurations the scenario declares from the start (its first
    step) are written here too, before any agent starts: a pool's routing mode (BGP, VXLAN,
    IPIP) is part of how the cluster is built (the lab's default pool is only added when the
    scenario has none), and a setting that needs a restart (FloatingIPs, say) would otherwise
    make every agent exit and the run fail."""
    docs: list[dict[str, Any]] = [dict(d) for d in scenario.steps[0].apply
                                  if d.get("kind") in START_KINDS] if scenario.steps else []
    for node in topology.nodes.values():
        docs.append({
            "apiVersion": CALICO_API,
            "kind": "Node",
            "metadata": {"name": node.name},
            "spec": {"bgp": {"ipv4Address": str(node.underlay_ip),
                             **({"ipv6Address": str(node.underlay_ip6)}
                                if node.underlay_ip6 is not None else {})}},
        })
    for ns in scenario.namespaces:
        docs.append({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns.name, "labels": {NAMESPACE_NAME_LABEL: ns.name, **ns.labels}},
        })
    for pod in scenario.pods:
        cidrs = [f"{a}/{a.max_prefixlen}" for a in pod.addresses]
        ports: list[dict[str, Any]] = []
        for port in pod.ports:
            entry: dict[str, Any] = {"containerPort": port.port, "protocol": port.protocol}
            if port.name:
                entry["name"] = port.name
            ports.append(entry)
        docs.append({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": pod.namespace,
                "labels": dict(pod.labels),
                "annotations": {CALICO_POD_IP_ANNOTATION: cidrs[0],
                                CALICO_POD_IPS_ANNOTATION: ",".join(cidrs),
                                **({FLOATING_IPS_ANNOTATION: json.dumps(
                                    [str(ip) for ip in pod.floating_ips])}
                                   if pod.floating_ips else {})},
            },
            "spec": {"nodeName": pod.node, "containers": [{"name": "main", "ports": ports}]},
            "status": {"phase": "Running", "podIP": str(pod.addresses[0]),
                       "podIPs": [{"ip": str(a)} for a in pod.addresses]},
        })
    return docs
