"""NodePorts in the real tc programs (BPF_PROG_TEST_RUN on crafted packets): calico_from_host
and calico_from_hep at a host interface, the backend's calico_to_wep / calico_from_wep, with
the maps written by BpfNatManager and the route map compiled from RouteUpdates.

The test namespace (conftest `netns_routes`): the host owns 192.0.2.1/24 on d1 (the external
client 192.0.2.50 is on that subnet) and 192.0.3.1/24 on d2, with 198.51.100.0/24 routed via
d2 (the "other node's" pods: the remote backend R). Pod B (10.65.0.2) is a local workload
behind d2. The NodePort is 30080/TCP; the backends listen on 8080.
"""

from __future__ import annotations

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import packets as pk
from pyfelix.agent.bpf.maps import nat_counters
from pyfelix.agent.bpf.testrun import TC_ACT_OK, TC_ACT_SHOT
from pyfelix.agent.dataplane.managers.bpf_nat import BpfNatManager
from tests.privileged.bpf.bpf_harness import Harness
from tests.privileged.bpf.test_priv_bpf_nat import TC_ACT_REDIRECT, parse, run, tcp_ok

pytestmark = pytest.mark.privileged

NODE, NODE2 = "192.0.2.1", "192.0.3.1"  # this host's addresses (d1, d2)
CLIENT, CLIENT2 = "192.0.2.50", "192.0.2.51"  # external clients, on d1's subnet
B = "10.65.0.2"  # local backend pod (d2)
R = "198.51.100.7"  # backend pod on another node (routed via d2)
NODE_PORT = 30080


def nodeport(*backends: str, protocol: int = 6) -> p.ServiceFrontendUpdate:
    return p.ServiceFrontendUpdate(
        id=f"{p.NODEPORT_VIP}:{NODE_PORT}/{protocol}", service="default/web", port_name="",
        vip=p.NODEPORT_VIP, port=NODE_PORT, protocol=protocol, kind="nodeport",
        backends=tuple(p.ServiceBackend(b, 8080) for b in backends))


def program(h: Harness, *frontends: p.ServiceFrontendUpdate,
            b_ingress: tuple[p.Rule, ...] = (p.Rule("allow"),)) -> None:
    """Pod B with ingress rules `b_ingress` (egress: allow), the host's addresses and the
    remote pods' block in the route map, and the frontends."""
    h.apply(p.ActiveProfileUpdate("b-profile", p.Profile(inbound_rules=b_ingress,
                                                         outbound_rules=(p.Rule("allow"),))),
            h.endpoint("b", "d2", profiles=("b-profile",)),
            p.RouteUpdate(f"{NODE}/32", "local_host"),
            p.RouteUpdate(f"{NODE2}/32", "local_host"),
            p.RouteUpdate(f"{B}/32", "local_workload", local_workload_iface="d2"),
            p.RouteUpdate("198.51.100.0/24", "remote_workload", dst_node="node2",
                          dst_node_ip="192.0.3.2"))
    h.dp.maps["nat_ct"].clear()
    h.dp.maps["conntrack"].clear()
    nat = BpfNatManager(h.dp.maps["nat_frontend"], h.dp.maps["nat_backend"],
                        h.dp.maps["nat_affinity"], h.dp.maps["nat_vip_filter"])
    for msg in (*frontends, p.InSync()):
        nat.on_update(msg)
    nat.apply()


def host(h: Harness, frame: bytes, iface: str = "d1",
         prog: str = "calico_from_host") -> tuple[int, bytes]:
    from pyfelix.agent.bpf.testrun import run_tc

    out = h.ns.call(run_tc, h.dp.prog_fd(prog), frame, ifindex=h.ifindexes[iface])
    return out.retval, out.data_out


def tuple_of(frame: bytes) -> tuple[str, int, str, int]:
    seen = parse(frame)
    assert seen["ip_csum_ok"] and seen.get("l4_csum_ok", True), seen
    return seen["src"], seen["sport"], seen["dst"], seen["dport"]


@pytest.mark.parametrize("prog", ["calico_from_host", "calico_from_hep"])
def test_nodeport_to_local_backend_keeps_the_client_and_its_policy(
        harness: Harness, netns_routes: None, prog: str) -> None:
    h = harness
    program(h, nodeport(B))
    # DNAT only: on through the host's stack to the local backend, the client kept
    rv, out = host(h, tcp_ok(CLIENT, NODE, 40000, NODE_PORT), prog=prog)
    assert rv == TC_ACT_OK
    assert tuple_of(out) == (CLIENT, 40000, B, 8080)
    # the backend's ingress policy sees the client and allows it
    rv, _ = run(h, "to", out, "d2")
    assert rv == TC_ACT_OK
    # the reply leaves the backend with the node's address and NodePort as its source,
    # redirected (a local source cannot go through the stack's input routing)
    rv, reply = run(h, "from", tcp_ok(B, CLIENT, 8080, 40000, "SA"), "d2")
    assert rv == TC_ACT_REDIRECT
    assert tuple_of(reply) == (NODE, NODE_PORT, CLIENT, 40000)
    # later client packets reuse the flow's backend
    rv, out = host(h, tcp_ok(CLIENT, NODE, 40000, NODE_PORT, "A"), prog=prog)
    assert rv == TC_ACT_OK and tuple_of(out)[2:] == (B, 8080)
    counts = nat_counters.read(h.dp.maps["nat_counters"])
    assert (counts["nodeport_new"], counts["nodeport_snat"], counts["replies"]) == (1, 0, 1)

    # ingress policy at the backend admitting only another address denies this client
    program(h, nodeport(B), b_ingress=(p.Rule("allow", src_nets=(CLIENT2 + "/32",)),))
    rv, out = host(h, tcp_ok(CLIENT, NODE, 40001, NODE_PORT), prog=prog)
    assert rv == TC_ACT_OK
    rv, _ = run(h, "to", out, "d2")
    assert rv == TC_ACT_SHOT


def test_nodeport_to_remote_backend_snats_to_the_node(harness: Harness,
                                                      netns_routes: None) -> None:
    h = harness
    program(h, nodeport(R))
    rv, out = host(h, tcp_ok(CLIENT, NODE, 40000, NODE_PORT))
    assert rv == TC_ACT_REDIRECT  # out via the route to R (d2), past the stack
    assert tuple_of(out) == (NODE, 40000, R, 8080)  # the client's port was free
    # R's reply comes back to the node and goes on to the client from the NodePort
    rv, reply = host(h, tcp_ok(R, NODE, 8080, 40000, "SA"), iface="d2")
    assert rv == TC_ACT_REDIRECT
    assert tuple_of(reply) == (NODE, NODE_PORT, CLIENT, 40000)
    # another client with the same port gets another SNAT port, and its own replies
    rv, out2 = host(h, tcp_ok(CLIENT2, NODE, 40000, NODE_PORT))
    src, sport, dst, dport = tuple_of(out2)
    assert rv == TC_ACT_REDIRECT and (src, dst, dport) == (NODE, R, 8080)
    assert 61000 <= sport <= 65535
    rv, reply2 = host(h, tcp_ok(R, NODE, 8080, sport, "SA"), iface="d2")
    assert rv == TC_ACT_REDIRECT and tuple_of(reply2) == (NODE, NODE_PORT, CLIENT2, 40000)
    # the first client's later packets keep their translation
    rv, out = host(h, tcp_ok(CLIENT, NODE, 40000, NODE_PORT, "A"))
    assert rv == TC_ACT_REDIRECT and tuple_of(out) == (NODE, 40000, R, 8080)
    # UDP (a zero checksum stays "none")
    program(h, nodeport(R, protocol=17))
    rv, out = host(h, pk.udp(CLIENT, NODE, 40002, NODE_PORT))
    seen = parse(out)
    assert rv == TC_ACT_REDIRECT and seen["ip_csum_ok"] and out[14 + 20 + 6:14 + 20 + 8] == b"\0\0"
    assert (seen["src"], seen["sport"], seen["dst"], seen["dport"]) == (NODE, 40002, R, 8080)
    counts = nat_counters.read(h.dp.maps["nat_counters"])
    assert counts["nodeport_snat"] == 3 and counts["no_route"] == 0


def test_nodeport_without_backends_rejects(harness: Harness, netns_routes: None) -> None:
    """externalTrafficPolicy: Local on a node without local endpoints (or no endpoints at
    all): the frontend has no backends and the client gets a port unreachable at once."""
    h = harness
    program(h, nodeport())
    syn = tcp_ok(CLIENT, NODE, 40000, NODE_PORT)
    rv, out = host(h, syn)
    assert rv == TC_ACT_REDIRECT  # back out of d1, to the client
    seen = parse(out)
    assert (seen["src"], seen["dst"], seen["icmp"]) == (NODE, CLIENT, (3, 3))
    assert seen["ip_csum_ok"] and seen["icmp_csum_ok"] and seen["quoted_dst"] == NODE
    assert nat_counters.read(h.dp.maps["nat_counters"])["rejected"] == 1


def test_other_host_traffic_is_untouched(harness: Harness, netns_routes: None) -> None:
    """Fail closed both ways: what is not NodePort traffic leaves calico_from_host exactly
    as it came (TC_ACT_OK, same bytes): another port of the host, the NodePort number to an
    address that is not the host's (forwarded traffic), ICMP, a reply nobody SNATed."""
    h = harness
    program(h, nodeport(B))
    for frame, iface in ((tcp_ok(CLIENT, NODE, 40000, 22), "d1"),
                         (tcp_ok(CLIENT, B, 40000, NODE_PORT), "d1"),
                         (tcp_ok(CLIENT, "198.51.100.9", 40000, NODE_PORT), "d1"),
                         (pk.icmp(CLIENT, NODE), "d1"),
                         (tcp_ok(R, NODE, 8080, 40000, "SA"), "d2")):
        rv, out = host(h, frame, iface)
        assert rv == TC_ACT_OK and out == frame, parse(frame)
    assert nat_counters.read(h.dp.maps["nat_counters"])["new_flows"] == 0
