"""VXLAN overlay with real agents and NO BIRD: two nodes, pods on each, connected only
through the routes, FDB and ARP entries the agents program on `vxlan.calico`.

1. A plain pool (no VXLAN) and no BGP: there is no route between the nodes' pods (deny).
2. The pool becomes `vxlanMode: Always`: pods reach each other across the nodes, policy is
   enforced (only port 80 allowed into `app == web`), and node1's kernel shows the device,
   its derived VTEP address, the FDB/ARP entries of node2's VTEP and onlink routes.
3. `vxlanMode: CrossSubnet` (both nodes share the underlay subnet): routes go straight over
   the underlay (no encapsulation), and pods still connect.
"""

from __future__ import annotations

import ipaddress
import json

import pytest

from pyfelix.lab.scenario import ProbeSpec
from tests.privileged.felix_extras.conftest import DATAPLANES
from tests.privileged.felix_extras.extras_lab import agent_lab, apply_and_sync, run_in

pytestmark = pytest.mark.privileged

CALICO = "projectcalico.org/v3"
SCENARIO = {
    "name": "vxlan",
    "nodes": ["node1", "node2"],
    "namespaces": [{"name": "x"}],
    "pods": [
        {"namespace": "x", "name": "a", "node": "node1", "ip": "10.65.0.10",
         "labels": {"app": "client"}, "ports": [{"port": 80, "protocol": "TCP"}]},
        {"namespace": "x", "name": "b", "node": "node2", "ip": "10.65.0.20",
         "labels": {"app": "web"},
         "ports": [{"port": 80, "protocol": "TCP"}, {"port": 81, "protocol": "TCP"}]},
    ],
}
WEB_ONLY_80 = {"apiVersion": CALICO, "kind": "GlobalNetworkPolicy",
               "metadata": {"name": "web-80"},
               "spec": {"selector": "app == 'web'", "types": ["Ingress"],
                        "ingress": [{"action": "Allow", "protocol": "TCP",
                                     "destination": {"ports": [80]}}]}}
IPS = {"x/a": ipaddress.IPv4Address("10.65.0.10"), "x/b": ipaddress.IPv4Address("10.65.0.20")}
PROBES = [ProbeSpec(src, dst, IPS[dst], port, "TCP")
          for src, dst, port in (("x/a", "x/b", 80), ("x/a", "x/b", 81), ("x/b", "x/a", 80))]


def pool(mode: str) -> dict:
    return {"apiVersion": CALICO, "kind": "IPPool", "metadata": {"name": "pods"},
            "spec": {"cidr": "10.65.0.0/16", "vxlanMode": mode}}


def results(lab, step: int) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.result for r in lab.run_probes(PROBES, step)]


@pytest.mark.parametrize("dataplane", DATAPLANES)
def test_two_nodes_over_vxlan_without_bird(dataplane: str, root_unchanged: None) -> None:
    with agent_lab(SCENARIO, dataplane) as lab:
        node1 = lab.topology.nodes["node1"].netns
        apply_and_sync(lab, [pool("Never"), WEB_ONLY_80])
        assert results(lab, 0) == ["deny", "deny", "deny"]  # no route between the nodes
        assert "vxlan.calico" not in run_in(node1, "ip", "link")

        apply_and_sync(lab, [pool("Always"), WEB_ONLY_80])
        assert results(lab, 1) == ["allow", "deny", "allow"]
        link = json.loads(run_in(node1, "ip", "-d", "-j", "link", "show", "vxlan.calico"))[0]
        info = link["linkinfo"]["info_data"]
        assert (info["id"], info["port"], info["local"]) == (4096, 4789, "198.18.0.1")
        assert link["mtu"] == 1450
        vtep_addr = json.loads(run_in(node1, "ip", "-j", "addr", "show", "vxlan.calico")
                               )[0]["addr_info"][0]["local"]
        assert vtep_addr.startswith("10.65.")  # derived from the pool: no Node address set
        route = run_in(node1, "ip", "route", "show", "10.65.0.20/32")
        assert "dev vxlan.calico" in route and "onlink" in route and "proto 81" in route
        gateway = route.split("via ")[1].split()[0]
        assert "PERMANENT" in run_in(node1, "ip", "neigh", "show", gateway, "dev",
                                     "vxlan.calico")
        fdb = run_in(node1, "bridge", "fdb", "show", "dev", "vxlan.calico")
        assert "dst 198.18.0.2" in fdb and "permanent" in fdb

        apply_and_sync(lab, [pool("CrossSubnet"), WEB_ONLY_80])
        assert results(lab, 2) == ["allow", "deny", "allow"]
        route = run_in(node1, "ip", "route", "show", "10.65.0.20/32")
        assert "via 198.18.0.2 dev eth0" in route  # same subnet: no encapsulation
