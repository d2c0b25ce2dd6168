"""NAT outgoing with real agents in lab namespaces: an external host on the underlay sees
the NODE's address as the source of a pod's connection when the pod's pool has
natOutgoing, the POD's address when it does not, and the pod's address again when the
destination is inside another IP pool (traffic between pools is never masqueraded).

The external host routes the pool back through node1, so connections work un-NATed too:
what the test measures is only the source address the external host sees.
"""

from __future__ import annotations

import pytest

from tests.privileged.felix_extras.conftest import DATAPLANES
from tests.privileged.felix_extras.extras_lab import (
    ExternalHost,
    RecordingServer,
    agent_lab,
    apply_and_sync,
    run_in,
    tcp_connect,
)

pytestmark = pytest.mark.privileged

POD_IP = "10.65.0.10"
NODE_IP = "198.18.0.1"
EXTERNAL = "198.18.1.100"
SCENARIO = {
    "name": "nat-outgoing",
    "nodes": ["node1"],
    "namespaces": [{"name": "x"}],
    "pods": [{"namespace": "x", "name": "a", "ip": POD_IP}],
}


def pool(name: str, cidr: str, nat: bool) -> dict:
    return {"apiVersion": "projectcalico.org/v3", "kind": "IPPool", "metadata": {"name": name},
            "spec": {"cidr": cidr, "natOutgoing": nat}}


@pytest.mark.parametrize("dataplane", DATAPLANES)
def test_external_host_sees_node_address_only_for_nat_outgoing_pools(
        dataplane: str, root_unchanged: None) -> None:
    with agent_lab(SCENARIO, dataplane) as lab:
        ext = ExternalHost(lab, address=EXTERNAL, routes={"10.65.0.0/16": NODE_IP}).create()
        server = RecordingServer(ext.netns, 8080)
        pod_ns = lab.topology.pods["x/a"].netns
        node_ns = lab.topology.nodes["node1"].netns
        try:
            apply_and_sync(lab, [pool("pods", "10.65.0.0/16", nat=True)])
            assert tcp_connect(pod_ns, EXTERNAL, 8080)
            assert server.peers[-1] == NODE_IP
            nat_rules = run_in(node_ns, "iptables-save", "-t", "nat")
            assert "cali-nat-outgoing" in nat_rules and "MASQUERADE" in nat_rules

            apply_and_sync(lab, [pool("pods", "10.65.0.0/16", nat=False)])
            assert tcp_connect(pod_ns, EXTERNAL, 8080)
            assert server.peers[-1] == POD_IP

            # natOutgoing again, but the destination is inside another pool: not translated
            apply_and_sync(lab, [pool("pods", "10.65.0.0/16", nat=True),
                                 pool("external", "198.18.1.0/24", nat=False)])
            assert tcp_connect(pod_ns, EXTERNAL, 8080)
            assert server.peers[-1] == POD_IP
            assert len(server.peers) == 3, server.peers
        finally:
            server.close()
