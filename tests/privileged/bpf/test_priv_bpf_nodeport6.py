"""IPv6 NodePorts in the real tc programs (BPF_PROG_TEST_RUN on crafted IPv6 frames):
calico_from_host and calico_from_hep at a host interface (bpf/include/nat6.h, "NodePorts"),
the backend's calico_to_wep / calico_from_wep, with the `*6` NAT maps written by the IPv6
BpfNatManager and the route map compiled from RouteUpdates.

The test namespace (`netns_routes6`, IPv6 forwarding on, as the agent sets it: the kernel's
FIB lookup helper answers FWD_DISABLED on an interface that does not forward): the host owns
fd00:2::1/64 on d1 (the external clients fd00:2::50 and ::51 are on that subnet) and
fd00:3::1/64 on d2, with fd00:198::/64 routed via d2 (the "other node's" pods: the remote
backend R6). Pod B (fd00:65::2) is a local workload behind d2. The NodePort is 30080; the
backends listen on 8080.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf.maps import nat_counters, nat_ct6
from pyfelix.agent.bpf.testrun import TC_ACT_OK, TC_ACT_SHOT, NetnsThread, run_tc
from pyfelix.agent.dataplane.managers.bpf_nat import BpfNatManager
from pyfelix.lab.services import frontends_for
from tests.privileged.bpf.bpf_harness import Harness
from tests.privileged.bpf.conftest import sh
from tests.privileged.bpf.test_priv_bpf_nat6 import (
    TC_ACT_REDIRECT,
    parse6,
    run,
    tcp6_ok,
    udp6_ok,
)

pytestmark = pytest.mark.privileged

NODE6, NODE6_D2 = "fd00:2::1", "fd00:3::1"  # this host's addresses (d1, d2)
CLIENT6, CLIENT6_2 = "fd00:2::50", "fd00:2::51"  # external clients, on d1's subnet
B6 = "fd00:65::2"  # local backend pod (d2)
R6 = "fd00:198::7"  # backend pod on another node (routed via d2)
NODE_PORT = 30080


@pytest.fixture
def netns_routes6(netns: tuple[NetnsThread, dict[str, int]]) -> Iterator[None]:
    """The addresses and routes of the module docstring, removed afterwards (forwarding
    back off)."""
    name = f"pyfbpf-{os.getpid()}"
    sh("ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
    steps = [("link", "set", "d1", "up"), ("link", "set", "d1p", "up"),
             ("link", "set", "d2", "up"), ("link", "set", "d2p", "up"),
             ("-6", "addr", "add", "fd00:2::1/64", "dev", "d1", "nodad"),
             ("-6", "addr", "add", "fd00:3::1/64", "dev", "d2", "nodad"),
             ("-6", "route", "add", "fd00:198::/64", "via", "fd00:3::2", "dev", "d2")]
    try:
        for step in steps:
            sh("ip", "-n", name, *step)
        yield
    finally:
        for step in (("-6", "route", "del", "fd00:198::/64"),
                     ("-6", "addr", "del", "fd00:2::1/64", "dev", "d1"),
                     ("-6", "addr", "del", "fd00:3::1/64", "dev", "d2")):
            subprocess.run(["ip", "-n", name, *step], check=False, timeout=30)
        subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw",
                        "net.ipv6.conf.all.forwarding=0"], check=False, timeout=30)


def nodeport6(*backends: str, protocol: int = 6) -> p.ServiceFrontendUpdate:
    return p.ServiceFrontendUpdate(
        id=f"{p.NODEPORT_VIP6}:{NODE_PORT}/{protocol}", service="default/web", port_name="",
        vip=p.NODEPORT_VIP6, port=NODE_PORT, protocol=protocol, kind="nodeport",
        backends=tuple(p.ServiceBackend(b, 8080) for b in backends))


def program(h: Harness, *frontends: p.ServiceFrontendUpdate,
            b_ingress: tuple[p.Rule, ...] = (p.Rule("allow"),)) -> None:
    """Pod B (IPv6) with ingress rules `b_ingress` (egress: allow), its /128 and the remote
    pods' block in the route map, the host's addresses (as the agent's interface monitor
    reports them: LOCAL_HOST entries), and the frontends, fed to both families' managers
    (the IPv4 one must take none of them)."""
    h.route_inputs.local_addrs = {"d1": frozenset({f"{NODE6}/64"}),
                                  "d2": frozenset({f"{NODE6_D2}/64"})}
    h.apply(p.ActiveProfileUpdate("b-profile", p.Profile(inbound_rules=b_ingress,
                                                         outbound_rules=(p.Rule("allow"),))),
            h.endpoint("b", "d2", profiles=("b-profile",), ipv6=(f"{B6}/128",)),
            p.RouteUpdate(f"{B6}/128", "local_workload", local_workload_iface="d2"),
            p.RouteUpdate("fd00:198::/64", "remote_workload", dst_node="node2",
                          dst_node_ip="fd00:3::2"))
    h.dp.maps["nat_ct6"].clear()
    h.dp.maps["conntrack"].clear()
    maps = h.dp.maps
    nat4 = BpfNatManager(maps["nat_frontend"], maps["nat_backend"], maps["nat_affinity"],
                         maps["nat_vip_filter"])
    nat6 = BpfNatManager(maps["nat_frontend6"], maps["nat_backend6"], maps["nat_affinity6"],
                         None, family=6)
    for nat in (nat4, nat6):
        for msg in (*frontends, p.InSync()):
            nat.on_update(msg)
        nat.apply()
    assert not list(maps["nat_frontend"].iter_keys())


def host(h: Harness, frame: bytes, iface: str = "d1",
         prog: str = "calico_from_host") -> tuple[int, bytes]:
    out = h.ns.call(run_tc, h.dp.prog_fd(prog), frame, ifindex=h.ifindexes[iface])
    return out.retval, out.data_out


def tuple_of(frame: bytes) -> tuple[str, int, str, int]:
    seen = parse6(frame)
    assert seen["l4_csum_ok"], seen
    return seen["src"], seen["sport"], seen["dst"], seen["dport"]


@pytest.mark.parametrize("prog", ["calico_from_host", "calico_from_hep"])
def test_ipv6_nodeport_to_local_backend_keeps_the_client_and_its_policy(
        harness: Harness, netns_routes6: None, prog: str) -> None:
    h = harness
    program(h, nodeport6(B6))
    # DNAT only: on through the host's stack to the local backend, the client kept
    rv, out = host(h, tcp6_ok(CLIENT6, NODE6, 40000, NODE_PORT), prog=prog)
    assert rv == TC_ACT_OK
    assert tuple_of(out) == (CLIENT6, 40000, B6, 8080)
    # the backend's ingress policy sees the client and allows it
    rv, _ = run(h, "to", out, "d2")
    assert rv == TC_ACT_OK
    # the reply leaves the backend with the node's address and NodePort as its source,
    # redirected (a local source cannot go through the stack's input routing)
    rv, reply = run(h, "from", tcp6_ok(B6, CLIENT6, 8080, 40000, "SA"), "d2")
    assert rv == TC_ACT_REDIRECT
    assert tuple_of(reply) == (NODE6, NODE_PORT, CLIENT6, 40000)
    # later client packets reuse the flow's backend
    rv, out = host(h, tcp6_ok(CLIENT6, NODE6, 40000, NODE_PORT, "A"), prog=prog)
    assert rv == TC_ACT_OK and tuple_of(out)[2:] == (B6, 8080)
    counts = nat_counters.read(h.dp.maps["nat_counters"])
    assert (counts["nodeport_new"], counts["nodeport_snat"], counts["replies"]) == (1, 0, 1)
    assert {row["nodeport"] for row in nat_ct6.dump(h.dp.maps["nat_ct6"])} == {True}
    # any of the node's IPv6 addresses serves (d2's too)
    rv, out = host(h, tcp6_ok(CLIENT6, NODE6_D2, 40005, NODE_PORT), prog="calico_from_host")
    assert rv == TC_ACT_OK and tuple_of(out) == (CLIENT6, 40005, B6, 8080)

    # ingress policy at the backend admitting only another address denies this client
    program(h, nodeport6(B6), b_ingress=(p.Rule("allow", src_nets=(CLIENT6_2 + "/128",)),))
    rv, out = host(h, tcp6_ok(CLIENT6, NODE6, 40001, NODE_PORT), prog=prog)
    assert rv == TC_ACT_OK
    rv, _ = run(h, "to", out, "d2")
    assert rv == TC_ACT_SHOT


def test_ipv6_nodeport_to_remote_backend_snats_to_the_node(harness: Harness,
                                                           netns_routes6: None) -> None:
    h = harness
    program(h, nodeport6(R6))
    rv, out = host(h, tcp6_ok(CLIENT6, NODE6, 40000, NODE_PORT))
    assert rv == TC_ACT_REDIRECT  # out via the route to R6 (d2), past the stack
    assert tuple_of(out) == (NODE6, 40000, R6, 8080)  # the client's port was free
    # R6's reply comes back to the node and goes on to the client from the NodePort
    rv, reply = host(h, tcp6_ok(R6, NODE6, 8080, 40000, "SA"), iface="d2")
    assert rv == TC_ACT_REDIRECT
    assert tuple_of(reply) == (NODE6, NODE_PORT, CLIENT6, 40000)
    snat = [r for r in nat_ct6.dump(h.dp.maps["nat_ct6"]) if r["kind"] == "rev"]
    assert [r.get("snat_peer") for r in snat] == [f"[{CLIENT6}]:40000"]
    # another client with the same port gets another SNAT port, and its own replies
    rv, out2 = host(h, tcp6_ok(CLIENT6_2, NODE6, 40000, NODE_PORT))
    src, sport, dst, dport = tuple_of(out2)
    assert rv == TC_ACT_REDIRECT and (src, dst, dport) == (NODE6, R6, 8080)
    assert 61000 <= sport <= 65535
    rv, reply2 = host(h, tcp6_ok(R6, NODE6, 8080, sport, "SA"), iface="d2")
    assert rv == TC_ACT_REDIRECT and tuple_of(reply2) == (NODE6, NODE_PORT, CLIENT6_2, 40000)
    # the first client's later packets keep their translation
    rv, out = host(h, tcp6_ok(CLIENT6, NODE6, 40000, NODE_PORT, "A"))
    assert rv == TC_ACT_REDIRECT and tuple_of(out) == (NODE6, 40000, R6, 8080)
    # UDP
    program(h, nodeport6(R6, protocol=17))
    rv, out = host(h, udp6_ok(CLIENT6, NODE6, 40002, NODE_PORT))
    assert rv == TC_ACT_REDIRECT and tuple_of(out) == (NODE6, 40002, R6, 8080)
    rv, reply = host(h, udp6_ok(R6, NODE6, 8080, 40002), iface="d2")
    assert rv == TC_ACT_REDIRECT and tuple_of(reply) == (NODE6, NODE_PORT, CLIENT6, 40002)
    counts = nat_counters.read(h.dp.maps["nat_counters"])
    assert counts["nodeport_snat"] == 3 and counts["no_route"] == 0


def test_ipv6_nodeport_without_backends_rejects(harness: Harness, netns_routes6: None) -> None:
    h = harness
    program(h, nodeport6())
    syn = tcp6_ok(CLIENT6, NODE6, 40000, NODE_PORT)
    rv, out = host(h, syn)
    assert rv == TC_ACT_REDIRECT  # back out of d1, to the client
    seen = parse6(out)
    assert (seen["src"], seen["dst"], seen["proto"], seen["icmp"]) == (NODE6, CLIENT6, 58, (1, 4))
    assert seen["icmp_csum_ok"] and seen["quoted_dst"] == NODE6
    assert out[0:6] == syn[6:12] and out[6:12] == syn[0:6]  # MACs swapped
    assert nat_counters.read(h.dp.maps["nat_counters"])["rejected"] == 1


def _dual_stack_nodeport(local: bool, endpoints: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """A dual-stack NodePort Service and its IPv6 EndpointSlice, as the API server and the
    slice controller write them."""
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "default"},
               "spec": {"type": "NodePort", "clusterIP": "10.96.0.40",
                        "clusterIPs": ["10.96.0.40", "fd00:96::40"],
                        "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                        "externalTrafficPolicy": "Local" if local else "Cluster",
                        "ports": [{"name": "http", "port": 80, "protocol": "TCP",
                                   "targetPort": 8080, "nodePort": NODE_PORT}]}}
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "web-v6", "namespace": "default",
                        "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv6", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": [{"addresses": [addr], "conditions": {"ready": True}, "nodeName": node}
                         for addr, node in endpoints]}
    return [service, eps]


def test_ipv6_external_traffic_policy_local(harness: Harness, netns_routes6: None) -> None:
    """externalTrafficPolicy: Local, from the Service documents through the agent's
    ServiceIndex (this node is node1): with a local endpoint only it serves (the client
    kept); with endpoints on other nodes only, it rejects at once; Cluster forwards to
    the remote one (SNAT)."""
    h = harness
    ours, theirs = (B6, "node1"), (R6, "node2")

    def node_port(local: bool, endpoints: list[tuple[str, str]]) -> p.ServiceFrontendUpdate:
        fronts = frontends_for(_dual_stack_nodeport(local, endpoints), "node1")
        return next(f for f in fronts if f.vip == p.NODEPORT_VIP6)

    program(h, node_port(True, [ours, theirs]))
    for sport in range(40000, 40008):  # never the remote one
        rv, out = host(h, tcp6_ok(CLIENT6, NODE6, sport, NODE_PORT))
        assert rv == TC_ACT_OK and tuple_of(out) == (CLIENT6, sport, B6, 8080)
    program(h, node_port(True, [theirs]))
    rv, out = host(h, tcp6_ok(CLIENT6, NODE6, 40010, NODE_PORT))
    assert rv == TC_ACT_REDIRECT and parse6(out)["icmp"] == (1, 4)
    program(h, node_port(False, [theirs]))
    rv, out = host(h, tcp6_ok(CLIENT6, NODE6, 40011, NODE_PORT))
    assert rv == TC_ACT_REDIRECT and tuple_of(out) == (NODE6, 40011, R6, 8080)


def test_ipv6_nodeport_rpf_at_host_endpoints(harness: Harness, netns_routes6: None) -> None:
    """calico_from_hep checks the source of what it would translate (Strict: the route back
    leaves by the arrival interface): a NodePort packet from a source routed via d2
    arriving on d1 drops; calico_from_host (no RPF) translates it."""
    h = harness
    program(h, nodeport6(B6))
    spoofed = tcp6_ok("fd00:198::99", NODE6, 40000, NODE_PORT)
    before = h.globals()["hep_rpf_dropped"]
    rv, _ = host(h, spoofed, prog="calico_from_hep")
    assert rv == TC_ACT_SHOT
    assert h.globals()["hep_rpf_dropped"] == before + 1
    rv, out = host(h, spoofed, prog="calico_from_host")
    assert rv == TC_ACT_OK and tuple_of(out)[2:] == (B6, 8080)


def test_other_ipv6_host_traffic_is_untouched(harness: Harness, netns_routes6: None) -> None:
    """Fail closed both ways: what is not IPv6 NodePort traffic leaves calico_from_host and
    calico_from_hep exactly as it came (TC_ACT_OK, same bytes): another port of the host,
    the NodePort number to an address that is not the host's (forwarded traffic: a pod, a
    routed block, an address with no route at all), ICMPv6, a reply nobody SNATed."""
    from pyfelix.agent.bpf import packets as pk

    h = harness
    program(h, nodeport6(B6), nodeport6(B6, protocol=17))
    frames = ((tcp6_ok(CLIENT6, NODE6, 40000, 22), "d1"),
              (tcp6_ok(CLIENT6, B6, 40000, NODE_PORT), "d1"),
              (tcp6_ok(CLIENT6, "fd00:198::9", 40000, NODE_PORT), "d1"),
              (tcp6_ok(CLIENT6, "fd00:99::1", 40000, NODE_PORT), "d1"),
              (udp6_ok(CLIENT6, "fd00:99::1", 40000, NODE_PORT), "d1"),
              (pk.icmp6(CLIENT6, NODE6), "d1"),
              (tcp6_ok(R6, NODE6, 8080, 40000, "SA"), "d2"))
    for prog in ("calico_from_host", "calico_from_hep"):
        for frame, iface in frames:
            rv, out = host(h, frame, iface, prog=prog)
            assert rv == TC_ACT_OK and out == frame, (prog, frame.hex())
    assert nat_counters.read(h.dp.maps["nat_counters"])["new_flows"] == 0
