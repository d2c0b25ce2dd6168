"""Host endpoints and failsafes with a real agent in lab namespaces.

node1's eth0 gets a host endpoint under a deny-all policy. From an external host on the
underlay: the inbound failsafe port (tcp:22) of the node stays reachable, tcp:8080 is
dropped; from the node: the outbound failsafe port (tcp:179) of the external host stays
reachable, tcp:8081 is dropped; a pod's forwarded traffic through eth0 is unaffected (no
applyOnForward policy). Failsafe ports changed in a FelixConfiguration apply live. A pod
reaching its own node is subject to DefaultEndpointToHostAction (Drop, then Accept).
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
DENY_ALL = {"apiVersion": CALICO, "kind": "GlobalNetworkPolicy",
            "metadata": {"name": "host-deny-all"},
            "spec": {"selector": "role == 'host'", "types": ["Ingress", "Egress"],
                     "ingress": [{"action": "Deny"}], "egress": [{"action": "Deny"}]}}


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

            # a pod talking to its own node: DefaultEndpointToHostAction
            assert not tcp_connect(pod_ns, NODE_IP, 8080)  # Drop, the default
            apply_and_sync(lab, [felix_config(defaultEndpointToHostAction="Accept")])
            assert tcp_connect(pod_ns, NODE_IP, 8080)
            # that FelixConfiguration no longer sets failsafes: back to Felix's defaults
            assert tcp_connect(ext.netns, NODE_IP, 22)
            assert not tcp_connect(ext.netns, NODE_IP, 8080)
        finally:
            for server in servers:
                server.close()
