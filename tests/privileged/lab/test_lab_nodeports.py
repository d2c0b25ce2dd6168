"""NodePort Services from a client outside the cluster, in the lab, with real agents, on BOTH
dataplanes (BPF: calico_from_host at the nodes' eth0, bpf/include/nat.h; iptables: the lab's
kube-proxy rules, KUBE-NODEPORTS), from one scenario.

Two nodes; the `external` client is the underlay's own namespace (no agent). The backends
(web-1, locked-1) run on node1 only, so:
- NodePort (externalTrafficPolicy Cluster) through node1 reaches the local backend, through
  node2 the backend on node1 (forwarded, source-NATed to node2: the backend sees node2's
  address on both dataplanes), TCP and UDP;
- externalTrafficPolicy Local: served through node1 with the client's own address kept;
  through node2 (no local backend) refused at once;
- the backend's ingress policy still applies: `locked` admits pods labelled app=web only,
  so its NodePort is denied through either node;
- traffic to the node that is not a NodePort (a port nothing serves) is refused as before;
- a host-networked client (`node/node2`) reaches the backend pod directly.
The root namespace must be as before afterwards (root_guard).
"""

from __future__ import annotations

from typing import Any

import pytest

from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import EXTERNAL_CLIENT_IP, parse_scenario

pytestmark = pytest.mark.privileged

PROBE_TIMEOUT = 2.0


def _node_port_service(name: str, cluster_ip: str, selector: str,
                       node_ports: tuple[int, int], **spec: Any) -> dict[str, Any]:
    tcp, udp = node_ports
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "shop"},
            "spec": {"type": "NodePort", "clusterIP": cluster_ip,
                     "selector": {"app": selector},
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP",
                                "targetPort": 8080, "nodePort": tcp},
                               {"name": "dns", "port": 53, "protocol": "UDP",
                                "targetPort": 5353, "nodePort": udp}], **spec}}


def _probe(target: str, port: int, expect: str, protocol: str = "TCP") -> dict[str, Any]:
    return {"from": "external", "to": target, "port": port, "protocol": protocol,
            "expect": expect}


SERVICES = [
    _node_port_service("web", "10.96.0.40", "web", (30080, 30053)),
    _node_port_service("web-local", "10.96.0.41", "web", (30081, 30054),
                       externalTrafficPolicy="Local"),
    _node_port_service("locked", "10.96.0.42", "locked", (30082, 30055)),
]

SCENARIO: dict[str, Any] = {
    "name": "services-nodeport",
    "nodes": ["node1", "node2"],
    "namespaces": [{"name": "shop"}],
    "pods": [
        {"namespace": "shop", "name": "web-1", "node": "node1", "labels": {"app": "web"},
         "ports": [{"port": 8080, "protocol": "TCP"}, {"port": 5353, "protocol": "UDP"}]},
        {"namespace": "shop", "name": "locked-1", "node": "node1", "labels": {"app": "locked"},
         "ports": [{"port": 8080, "protocol": "TCP"}]},
        {"namespace": "shop", "name": "client", "node": "node2", "labels": {"app": "client"}},
    ],
    "resources": [
        *SERVICES,
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": {"name": "locked-from-web", "namespace": "shop"},
         "spec": {"podSelector": {"matchLabels": {"app": "locked"}},
                  "policyTypes": ["Ingress"],
                  "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}},
    ],
    "probes": [
        # pods reach each other (the lab works), and the backend is alive
        {"from": "shop/client", "to": "shop/web-1", "port": 8080, "expect": "allow"},
        {"from": "node/node2", "to": "shop/web-1", "port": 8080, "expect": "allow"},  # host
        _probe("node/node1", 30080, "allow"),
        _probe("node/node2", 30080, "allow"),
        _probe("node/node1", 30053, "allow", "UDP"),
        _probe("node/node2", 30053, "allow", "UDP"),
        _probe("node/node1", 30081, "allow"),
        _probe("node/node2", 30081, "deny"),
        _probe("node/node1", 30054, "allow", "UDP"),
        _probe("node/node2", 30054, "deny", "UDP"),
        _probe("node/node1", 30082, "deny"),
        _probe("node/node2", 30082, "deny"),
        _probe("node/node1", 31999, "deny"),  # not a NodePort: nothing listens
    ],
}


@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
def test_node_ports_from_an_external_client(dataplane: str, root_guard: Any) -> None:
    scenario = parse_scenario(SCENARIO)
    with LabRunner(scenario, agents=AgentProcesses(dataplane), dataplane=dataplane,
                   program_routes=False, probe_timeout=PROBE_TIMEOUT) as lab:
        lab.build()
        lab.start_agents()
        results = lab.run_steps()
        wrong = [r.to_json() for r in results if r.mismatch]
        assert not wrong, wrong
        by_target = {(r.probe.target, r.probe.port): r for r in results}
        # externalTrafficPolicy Local without a local endpoint: refused at once
        for port in (30081, 30054):
            refused = by_target[("node/node2", port)]
            assert refused.detail == "refused" and refused.seconds < PROBE_TIMEOUT / 2, \
                refused.to_json()
        assert by_target[("node/node1", 31999)].detail == "refused"

        # who the backend saw: one connection at a time
        web = lab.topology.pods["shop/web-1"].netns
        node2_ip = str(lab.topology.nodes["node2"].ip)
        client_ip = str(EXTERNAL_CLIENT_IP.ip)

        def peers_of(target: str, port: int) -> set[str]:
            lab.servers.peers.clear()
            probe = next(p for p in scenario.steps[0].probes
                         if (p.target, p.port) == (target, port))
            assert lab.run_probes([probe])[0].result == "allow"
            return set(lab.servers.peers[(web, 8080, "TCP")])

        assert peers_of("node/node2", 30080) == {node2_ip}  # forwarded: SNAT to node2
        assert peers_of("node/node1", 30081) == {client_ip}  # Local: the client kept
        if dataplane == "bpf":  # a local backend keeps the client (kube-proxy masquerades)
            assert peers_of("node/node1", 30080) == {client_ip}
    root_guard.check()
