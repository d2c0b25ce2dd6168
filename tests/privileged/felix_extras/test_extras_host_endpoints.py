"""Host endpoints and failsafes with a real agent in lab namespaces, on both dataplanes.

In BPF mode the tc programs police the pods and iptables (host-endpoints-only) polices the
host interfaces: these tests check that split from the outside.

- Failsafes: node1's eth0 gets a host endpoint under a deny-all policy. From an external
  host on the underlay: the inbound failsafe port (tcp:22) of the node stays reachable,
  tcp:8080 is dropped; from the node: the outbound failsafe port (tcp:179) of the external
  host stays reachable, tcp:8081 is dropped; a pod's forwarded traffic through eth0 is
  unaffected (no applyOnForward policy). Failsafe ports changed in a FelixConfiguration
  apply live, and Felix's defaults come back when it stops setting them.
- Pod to its own node with DefaultEndpointToHostAction Accept (agent setting) under a
  deny-all "*" host endpoint: the pod reaches the node (host endpoint policy never judges
  workload traffic), the external host does not; the pod's egress policy still applies
  first; pod-to-external traffic is forwarded untouched.
- DefaultEndpointToHostAction switched live by a FelixConfiguration (Drop -> Accept).
- The other host endpoint policy kinds on eth0, seen from the external host: a doNotTrack
  deny of one port (not a source-only deny, so beyond what XDP drops), a preDNAT deny and
  an applyOnForward deny of ports of a pod behind the node; other ports pass.
"""

from __future__ import annotations

import pytest

from tests.privileged.felix_extras.conftest import DATAPLANES
from tests.privileged.felix_extras.extras_lab import (
    ExternalHost,
    RecordingServer,
    agent_lab,
    apply_and_sync,
    tcp_connect,
)

pytestmark = pytest.mark.privileged

NODE_IP = "198.18.0.1"
EXTERNAL = "198.18.1.100"
SCENARIO = {
    "name": "host-endpoints",
    "nodes": ["node1"],
    "namespaces": [{"name": "x"}],
    "pods": [{"namespace": "x", "name": "a", "ip": "10.65.0.10"}],
}
CALICO = "projectcalico.org/v3"
HOST_ENDPOINT = {"apiVersion": CALICO, "kind": "HostEndpoint",
                 "metadata": {"name": "node1-eth0", "labels": {"role": "host"}},
                 "spec": {"node": "node1", "interfaceName": "eth0",
                          "expectedIPs": [NODE_IP]}}
ALL_INTERFACES = {"apiVersion": CALICO, "kind": "HostEndpoint",
                  "metadata": {"name": "node1-all", "labels": {"role": "host"}},
                  "spec": {"node": "node1", "interfaceName": "*"}}
DENY_ALL = {"apiVersion": CALICO, "kind": "GlobalNetworkPolicy",
            "metadata": {"name": "host-deny-all"},
            "spec": {"selector": "role == 'host'", "types": ["Ingress", "Egress"],
                     "ingress": [{"action": "Deny"}], "egress": [{"action": "Deny"}]}}
POD_NO_EGRESS_TO_8080 = {
    "apiVersion": CALICO, "kind": "GlobalNetworkPolicy",
    "metadata": {"name": "pod-no-8080"},
    "spec": {"selector": "projectcalico.org/namespace == 'x'", "types": ["Egress"],
             "egress": [{"action": "Deny", "protocol": "TCP",
                         "destination": {"ports": [8080]}},
                        {"action": "Allow"}]}}




def host_policy(name: str, ingress: list[dict], **flags: bool) -> dict:
    return {"apiVersion": CALICO, "kind": "GlobalNetworkPolicy", "metadata": {"name": name},
            "spec": {"selector": "role == 'host'", "types": ["Ingress"], "ingress": ingress,
                     **flags}}


def deny_port(port: int) -> dict:
    return {"action": "Deny", "protocol": "TCP", "destination": {"ports": [port]}}


def felix_config(**spec: object) -> dict:
    return {"apiVersion": CALICO, "kind": "FelixConfiguration",
            "metadata": {"name": "default"}, "spec": spec}


@pytest.mark.parametrize("dataplane", DATAPLANES)
def test_failsafe_ports_stay_reachable_under_deny_all_host_endpoint_policy(
        dataplane: str, root_unchanged: None) -> None:
    with agent_lab(SCENARIO, dataplane) as lab:
        node_ns = lab.topology.nodes["node1"].netns
        pod_ns = lab.topology.pods["x/a"].netns
        ext = ExternalHost(lab, address=EXTERNAL, routes={"10.65.0.0/16": NODE_IP}).create()
        servers = [RecordingServer(node_ns, port) for port in (22, 8080)]
        servers += [RecordingServer(ext.netns, port) for port in (179, 8081)]
        try:
            # no host endpoint: the host is open both ways
            assert tcp_connect(ext.netns, NODE_IP, 8080)
            assert tcp_connect(node_ns, EXTERNAL, 8081)

            apply_and_sync(lab, [HOST_ENDPOINT, DENY_ALL])
            assert tcp_connect(ext.netns, NODE_IP, 22)  # inbound failsafe
            assert not tcp_connect(ext.netns, NODE_IP, 8080)
            assert tcp_connect(node_ns, EXTERNAL, 179)  # outbound failsafe
            assert not tcp_connect(node_ns, EXTERNAL, 8081)
            assert tcp_connect(pod_ns, EXTERNAL, 8081)  # forwarded: not host traffic

            # failsafes from the datastore, Calico's spelling
            apply_and_sync(lab, [felix_config(failsafeInboundHostPorts=[
                {"protocol": "TCP", "port": 8080}])])
            assert tcp_connect(ext.netns, NODE_IP, 8080)
            assert not tcp_connect(ext.netns, NODE_IP, 22)

            # the FelixConfiguration no longer sets failsafes: back to Felix's defaults
            apply_and_sync(lab, [felix_config(logSeverityScreen="Info")])
            assert tcp_connect(ext.netns, NODE_IP, 22)
            assert not tcp_connect(ext.netns, NODE_IP, 8080)
        finally:
            for server in servers:
                server.close()


@pytest.mark.parametrize("dataplane", DATAPLANES)
def test_pod_reaches_its_node_under_deny_all_wildcard_host_endpoint_when_action_is_accept(
        dataplane: str, root_unchanged: None) -> None:
    env = {"FELIX_DEFAULTENDPOINTTOHOSTACTION": "Accept"}
    with agent_lab(SCENARIO, dataplane, extra_env=env) as lab:
        node_ns = lab.topology.nodes["node1"].netns
        pod_ns = lab.topology.pods["x/a"].netns
        ext = ExternalHost(lab, address=EXTERNAL, routes={"10.65.0.0/16": NODE_IP}).create()
        servers = [RecordingServer(node_ns, port) for port in (8080, 8081)]
        servers.append(RecordingServer(ext.netns, 8081))
        try:
            apply_and_sync(lab, [ALL_INTERFACES, DENY_ALL])
            assert not tcp_connect(ext.netns, NODE_IP, 8080)  # "*" covers eth0
            assert not tcp_connect(node_ns, EXTERNAL, 8081)
            assert tcp_connect(pod_ns, NODE_IP, 8080)  # workload -> host: Accept
            assert tcp_connect(pod_ns, EXTERNAL, 8081)  # forwarded through eth0

            # the pod's own egress policy still decides first
            apply_and_sync(lab, [POD_NO_EGRESS_TO_8080])
            assert not tcp_connect(pod_ns, NODE_IP, 8080)
            assert tcp_connect(pod_ns, NODE_IP, 8081)
        finally:
            for server in servers:
                server.close()


# The datastore spells the key "defaultEndpointToHostAction"; both dataplanes must take it.
_LIVE_ACTION_DATAPLANES = DATAPLANES


@pytest.mark.parametrize("dataplane", _LIVE_ACTION_DATAPLANES)
def test_default_endpoint_to_host_action_switches_live(dataplane: str,
                                                       root_unchanged: None) -> None:
    with agent_lab(SCENARIO, dataplane) as lab:
        node_ns = lab.topology.nodes["node1"].netns
        pod_ns = lab.topology.pods["x/a"].netns
        server = RecordingServer(node_ns, 8080)
        try:
            assert not tcp_connect(pod_ns, NODE_IP, 8080)  # Drop, the default
            apply_and_sync(lab, [felix_config(defaultEndpointToHostAction="Accept")])
            assert tcp_connect(pod_ns, NODE_IP, 8080)
        finally:
            server.close()


@pytest.mark.parametrize("dataplane", DATAPLANES)
def test_do_not_track_pre_dnat_and_apply_on_forward_host_endpoint_policy(
        dataplane: str, root_unchanged: None) -> None:
    pod_ip = SCENARIO["pods"][0]["ip"]  # type: ignore[index]
    with agent_lab(SCENARIO, dataplane) as lab:
        node_ns = lab.topology.nodes["node1"].netns
        pod_ns = lab.topology.pods["x/a"].netns
        ext = ExternalHost(lab, address=EXTERNAL, routes={"10.65.0.0/16": NODE_IP}).create()
        servers = [RecordingServer(node_ns, port) for port in (9000, 9001)]
        servers += [RecordingServer(pod_ns, port) for port in (8082, 8083, 8084)]
        try:
            allow_all = {"apiVersion": CALICO, "kind": "GlobalNetworkPolicy",
                         "metadata": {"name": "host-allow-all", },
                         "spec": {"selector": "role == 'host'", "order": 1000,
                                  "types": ["Ingress", "Egress"],
                                  "ingress": [{"action": "Allow"}],
                                  "egress": [{"action": "Allow"}]}}
            apply_and_sync(lab, [
                HOST_ENDPOINT, allow_all,
                host_policy("untracked-no-9000", [deny_port(9000)], doNotTrack=True,
                            applyOnForward=True),
                host_policy("pre-dnat-no-8082", [deny_port(8082)], preDNAT=True,
                            applyOnForward=True),
                host_policy("forward-no-8084", [deny_port(8084), {"action": "Allow"}],
                            applyOnForward=True),
            ])
            assert not tcp_connect(ext.netns, NODE_IP, 9000)  # raw table
            assert tcp_connect(ext.netns, NODE_IP, 9001)
            assert not tcp_connect(ext.netns, pod_ip, 8082)  # mangle, before routing
            assert tcp_connect(ext.netns, pod_ip, 8083)
            assert not tcp_connect(ext.netns, pod_ip, 8084)  # filter FORWARD
        finally:
            for server in servers:
                server.close()
