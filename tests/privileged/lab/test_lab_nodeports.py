"""NodePort Services from a client outside the cluster, in the lab, with real agents, on BOTH
dataplanes (BPF: calico_from_host at the nodes' eth0, bpf/include/nat.h; iptables: the lab's
kube-proxy rules, KUBE-NODEPORTS), from one scenario (tests/lab/scenarios/services-nodeport.yaml).

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

`test_node_ports_dual_stack` (marked extended: `make test-matrix`; in `make test` the IPv6
NAT itself is covered by tests/privileged/bpf/test_priv_bpf_nodeport6.py and the ip6tables
rendering by tests/lab/test_lab_service_rules.py) runs the same scenario under
`--ip-family dual`: every IPv6 probe (to the node's IPv6 underlay address, from the
external client's IPv6 address) gives its IPv4 twin's verdict, and the backend sees node2's
IPv6 address through node2 (SNAT) and the client's own with externalTrafficPolicy Local.
Measured: 18.6 s (bpf), 7.8 s (iptables), beside 18.9 s and 7.5 s for the IPv4 test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.family import apply_ip_family, external_client_ipv6
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import EXTERNAL_CLIENT_IP, load_scenario

pytestmark = pytest.mark.privileged

SCENARIO = Path(__file__).resolve().parents[2] / "lab" / "scenarios" / "services-nodeport.yaml"
PROBE_TIMEOUT = 2.0


@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
def test_node_ports_from_an_external_client(dataplane: str, root_guard: Any) -> None:
    scenario = load_scenario(SCENARIO)
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


@pytest.mark.extended
@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
def test_node_ports_dual_stack(dataplane: str, root_guard: Any) -> None:
    scenario = apply_ip_family(load_scenario(SCENARIO), "dual")
    with LabRunner(scenario, agents=AgentProcesses(dataplane), dataplane=dataplane,
                   program_routes=False, probe_timeout=PROBE_TIMEOUT) as lab:
        lab.build()
        lab.start_agents()
        results = lab.run_steps()
        wrong = [r.to_json() for r in results if r.mismatch]
        assert not wrong, wrong
        assert [r.probe.family for r in results] == [4, 6] * (len(results) // 2)
        for v4, v6 in zip(results[::2], results[1::2], strict=True):
            assert (v4.probe.source, v4.probe.target, v4.probe.port) == \
                (v6.probe.source, v6.probe.target, v6.probe.port)
            assert v4.result == v6.result, (v4.to_json(), v6.to_json())
        by_target = {(r.probe.target, r.probe.port): r for r in results if r.probe.family == 6}
        # eTP Local without a local endpoint: refused (ICMPv6 port unreachable), not timed
        # out. UDP at once; TCP after the SYN's retransmission (~1 s) on BOTH dataplanes
        # (kube-proxy's ip6tables REJECT too): the error about the first SYN arrives while
        # connect() still holds the socket lock (the lab's veths deliver it synchronously),
        # and Linux's tcp_v6_err keeps it as a soft error (TcpExtLockDroppedIcmps).
        for port, within in ((30054, PROBE_TIMEOUT / 2), (30081, PROBE_TIMEOUT)):
            refused = by_target[("node/node2", port)]
            assert refused.detail == "refused" and refused.seconds < within, refused.to_json()

        web = lab.topology.pods["shop/web-1"].netns
        node2_ip6 = str(lab.topology.nodes["node2"].underlay_ip6.ip)  # type: ignore[union-attr]
        client_ip6 = str(external_client_ipv6().ip)

        def peers_of(target: str, port: int) -> set[str]:
            lab.servers.peers.clear()
            probe = next(p for p in scenario.steps[0].probes
                         if (p.target, p.port, p.family) == (target, port, 6))
            assert lab.run_probes([probe])[0].result == "allow"
            return set(lab.servers.peers[(web, 8080, "TCP")])

        assert peers_of("node/node2", 30080) == {node2_ip6}  # forwarded: SNAT to node2
        assert peers_of("node/node1", 30081) == {client_ip6}  # Local: the client kept
        if dataplane == "bpf":
            assert peers_of("node/node1", 30080) == {client_ip6}
    root_guard.check()
