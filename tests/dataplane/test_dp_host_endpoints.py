"""Host endpoints, failsafes, DefaultEndpointToHostAction and IPVS awareness, judged by what
the programmed raw -> mangle -> filter chains DO to packets (PacketWalker).

A packet arriving for the host walks raw PREROUTING, mangle PREROUTING, then filter INPUT
(one packet, its mark carried along); a forwarded one ends in filter FORWARD; a packet the
host sends walks raw OUTPUT then filter OUTPUT.

Host endpoint tests run in both modes (`mode` fixture): iptables, and BPF mode's
host-endpoints-only iptables manager. The BPF-mode tests at the end check the split: no
iptables rule judges workload traffic there, and only the policies and IP sets host
endpoints use are programmed.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from pyfelix.agent.dataplane.events import (
    IFACE_ABSENT,
    IFACE_UP,
    InterfaceAddrsUpdate,
    InterfaceUpdate,
)
from pyfelix.agent.dataplane.iptables.hostendpoints import Failsafes, parse_failsafe_ports
from pyfelix.agent.dataplane.iptables.names import (
    CALC_IPSET_PREFIXES,
    IPSET_TYPE_NET,
    ipset_name,
    policy_chain_name,
)
from pyfelix.agent.dataplane.managers.hostips import HostIPsManager
from pyfelix.agent.dataplane.managers.ipsets import IPSetsManager
from pyfelix.agent.dataplane.managers.iptables import IptablesManager
from pyfelix.agent.proto import (
    ActivePolicyRemove,
    ActivePolicyUpdate,
    ActiveProfileUpdate,
    ConfigUpdate,
    HostEndpoint,
    HostEndpointID,
    HostEndpointRemove,
    HostEndpointUpdate,
    InSync,
    IPSetDeltaUpdate,
    IPSetUpdate,
    Policy,
    PolicyID,
    PortRange,
    Profile,
    Rule,
    TierInfo,
    VXLANTunnelEndpointRemove,
    VXLANTunnelEndpointUpdate,
)
from tests.dataplane.dp_harness import endpoint
from tests.fakes.commands import FakeCommands
from tests.fakes.netfilter import Packet, PacketWalker

HOST_IP = "198.18.0.1"
PEER = "198.18.0.9"
FAILSAFES = Failsafes(inbound=(("tcp", 22), ("udp", 68)), outbound=(("udp", 53), ("tcp", 179)))
ALLOW_ALL = ActiveProfileUpdate("allow-all", Profile(inbound_rules=(Rule(action="allow"),),
                                                     outbound_rules=(Rule(action="allow"),)))


class HostHarness:
    """IP sets + host IPs + iptables managers over one FakeCommands, wired as
    `linux_managers()` wires them in `mode` ("iptables", or "bpf": iptables for host
    endpoints only, IP sets limited to what those rules match)."""

    def __init__(self, mode: str = "iptables", *, cmds: FakeCommands | None = None,
                 **iptables_kw: object) -> None:
        self.cmds = cmds or FakeCommands()
        bpf = mode == "bpf"
        kw = {"failsafes": FAILSAFES, "host_endpoints_only": bpf, **iptables_kw}
        self.iptables = IptablesManager(runner=self.cmds, **kw)  # type: ignore[arg-type]
        self.ipsets = IPSetsManager(runner=self.cmds,
                                    only=self.iptables.referenced_ip_sets if bpf else None)
        self.managers = [self.ipsets, HostIPsManager(runner=self.cmds), self.iptables]
        self.walker = PacketWalker(self.cmds.iptables, self.cmds.ipset)

    def feed(self, *msgs: object) -> None:
        for msg in msgs:
            for manager in self.managers:
                manager.on_update(msg)

    def apply(self) -> None:
        for manager in self.managers:
            manager.apply()
        for manager in self.managers:
            manager.finish_apply()

    def sync(self, *msgs: object) -> None:
        self.feed(InterfaceUpdate("eth0", 2, IFACE_UP),
                  InterfaceAddrsUpdate("eth0", frozenset({f"{HOST_IP}/15"})),
                  InterfaceUpdate("lo", 1, IFACE_UP),
                  InterfaceAddrsUpdate("lo", frozenset({"127.0.0.1/8"})), *msgs, InSync())
        self.apply()

    def _chain(self, steps: list[tuple[str, str]], packet: Packet) -> str:
        for table, chain in steps:
            verdict, packet = self.walker.walk(chain, packet, table)
            if verdict == "DROP":
                return "DROP"
            if packet in self.walker.untracked:
                packet = replace(packet, ctstate="UNTRACKED")
        return verdict

    def to_host(self, iif: str = "eth0", **kw: object) -> str:
        packet = Packet(**{"src": PEER, "dst": HOST_IP, "iif": iif, **kw})  # type: ignore[arg-type]
        return self._chain([("raw", "PREROUTING"), ("mangle", "PREROUTING"),
                            ("filter", "INPUT")], packet)

    def from_host(self, oif: str = "eth0", **kw: object) -> str:
        packet = Packet(**{"src": HOST_IP, "dst": PEER, "oif": oif, **kw})  # type: ignore[arg-type]
        return self._chain([("raw", "OUTPUT"), ("filter", "OUTPUT")], packet)

    def forward(self, iif: str, oif: str, **kw: object) -> str:
        packet = Packet(**{"src": PEER, "dst": "10.65.0.2", "iif": iif, "oif": oif, **kw})  # type: ignore[arg-type]
        return self._chain([("raw", "PREROUTING"), ("mangle", "PREROUTING"),
                            ("filter", "FORWARD")], packet)


def hep(name: str = "eth0", *, tiers=(), profiles=(), untracked=(), pre_dnat=(), forward=(),  # type: ignore[no-untyped-def]
        ips: tuple[str, ...] = (), hep_id: str = "node1-eth0") -> HostEndpointUpdate:
    return HostEndpointUpdate(HostEndpointID(hep_id), HostEndpoint(
        name=name, profile_ids=tuple(profiles), expected_ipv4_addrs=ips, tiers=tuple(tiers),
        untracked_tiers=tuple(untracked), pre_dnat_tiers=tuple(pre_dnat),
        forward_tiers=tuple(forward)))


def policy(name: str, *, inbound=(), outbound=(), **flags: bool) -> ActivePolicyUpdate:  # type: ignore[no-untyped-def]
    return ActivePolicyUpdate(PolicyID("default", name), Policy(
        inbound_rules=tuple(inbound), outbound_rules=tuple(outbound), **flags))


def tier(*names: str, ingress: bool = True, egress: bool = True) -> TierInfo:
    return TierInfo("default", ingress_policies=names if ingress else (),
                    egress_policies=names if egress else ())


@pytest.fixture(params=["iptables", "bpf"])
def mode(request: pytest.FixtureRequest) -> str:
    """Host endpoint behaviour is the same in both dataplane modes (in BPF mode the same
    iptables rules, rendered by a host-endpoints-only manager, enforce it)."""
    return str(request.param)


DENY_ALL = policy("deny-all", inbound=[Rule(action="deny")], outbound=[Rule(action="deny")])
TCP = 6
UDP = 17


def test_host_endpoint_without_policy_denies_all_but_failsafes(mode: str) -> None:
    h = HostHarness(mode)
    h.sync(hep())
    assert h.to_host(proto=TCP, dport=80) == "DROP"
    assert h.to_host(proto=TCP, dport=22) == "ACCEPT"  # failsafe inbound
    assert h.to_host(proto=UDP, dport=68) == "ACCEPT"
    assert h.to_host(proto=TCP, dport=80, ctstate="ESTABLISHED") == "ACCEPT"
    assert h.from_host(proto=UDP, dport=53) == "ACCEPT"  # failsafe outbound
    assert h.from_host(proto=TCP, dport=80) == "DROP"
    # other interfaces and workloads are not this endpoint
    assert h.to_host(iif="eth1", proto=TCP, dport=80) == "ACCEPT"
    assert h.from_host(oif="eth1", proto=TCP, dport=80) == "ACCEPT"
    assert h.from_host(oif="cali1", proto=TCP, dport=80) == "ACCEPT"


def test_deny_all_policy_never_blocks_failsafe_ports(mode: str) -> None:
    h = HostHarness(mode)
    h.sync(DENY_ALL, hep(tiers=[tier("deny-all")]))
    assert h.to_host(proto=TCP, dport=22) == "ACCEPT"
    assert h.to_host(proto=TCP, dport=23) == "DROP"
    assert h.from_host(proto=TCP, dport=179) == "ACCEPT"
    assert h.from_host(proto=TCP, dport=180) == "DROP"
    # failsafes changed through the datastore's FelixConfiguration
    h.feed(ConfigUpdate((("FailsafeInboundHostPorts", "tcp:2222"),
                         ("FailsafeOutboundHostPorts", ""))))
    h.apply()
    assert h.to_host(proto=TCP, dport=2222) == "ACCEPT"
    assert h.to_host(proto=TCP, dport=22) == "DROP"
    assert h.from_host(proto=UDP, dport=53) == "DROP"
    # a malformed value keeps the previous one
    h.feed(ConfigUpdate((("FailsafeInboundHostPorts", "icmp:7"),)))
    h.apply()
    assert h.to_host(proto=TCP, dport=2222) == "ACCEPT"
    # a FelixConfiguration resource's spelling: camelCase key, JSON list of {protocol, port}
    ports = '[{"port": 8443, "protocol": "TCP"}, {"port": 500, "protocol": "UDP"}]'
    h.feed(ConfigUpdate((("failsafeInboundHostPorts", ports),)))
    h.apply()
    assert h.to_host(proto=TCP, dport=8443) == "ACCEPT"
    assert h.to_host(proto=UDP, dport=500) == "ACCEPT"
    assert h.to_host(proto=TCP, dport=2222) == "DROP"


@pytest.mark.parametrize(("text", "ports"), [
    ("tcp:22, udp:68,179", (("tcp", 22), ("udp", 68), ("tcp", 179))),
    ('[{"protocol": "SCTP", "port": 9}, {"port": 10}]', (("sctp", 9), ("tcp", 10))),
    ("", ()),
])
def test_failsafe_port_lists_in_both_spellings(text: str, ports: tuple) -> None:  # type: ignore[type-arg]
    assert parse_failsafe_ports(text) == ports


@pytest.mark.parametrize("text", ["icmp:1", "tcp:0", "tcp:x", "[1]", "[{\"protocol\": \"tcp\"}]",
                                  "[unclosed"])
def test_bad_failsafe_port_lists_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_failsafe_ports(text)


def test_policies_and_profiles_of_a_host_endpoint(mode: str) -> None:
    h = HostHarness(mode)
    web = policy("web", inbound=[Rule(action="allow", protocol=TCP,
                                      dst_ports=(PortRange(80, 80),))])
    h.sync(web, ALLOW_ALL, hep(tiers=[tier("web", egress=False)], profiles=["allow-all"]))
    assert h.to_host(proto=TCP, dport=80) == "ACCEPT"
    assert h.to_host(proto=TCP, dport=81) == "DROP"  # the tier's default deny
    assert h.from_host(proto=TCP, dport=443) == "ACCEPT"  # no egress tier: the profile
    h.feed(ActivePolicyRemove(PolicyID("default", "web")), hep(profiles=["allow-all"]))
    h.apply()
    assert h.to_host(proto=TCP, dport=81) == "ACCEPT"


def test_pre_dnat_policy_decides_in_mangle_and_failsafes_still_win(mode: str) -> None:
    h = HostHarness(mode)
    deny_peer = policy("deny-peer", inbound=[Rule(action="deny", src_nets=(f"{PEER}/32",))],
                       pre_dnat=True)
    allow_8080 = policy("allow-8080", inbound=[Rule(action="allow", protocol=TCP,
                                                    dst_ports=(PortRange(8080, 8080),))],
                        pre_dnat=True)
    h.sync(deny_peer, allow_8080, DENY_ALL,
           hep(tiers=[tier("deny-all")], pre_dnat=[tier("allow-8080", "deny-peer",
                                                        egress=False)]))
    assert h.to_host(proto=TCP, dport=8080) == "ACCEPT"  # pre-DNAT allow skips normal deny
    assert h.to_host(proto=TCP, dport=9090) == "DROP"
    assert h.to_host(proto=TCP, dport=22) == "ACCEPT"  # failsafe before pre-DNAT deny
    assert "cali-fh-eth0" in h.cmds.iptables.tables["mangle"]
    # unmatched by pre-DNAT policy: on to the normal policy (which allows)
    h.feed(ALLOW_ALL, hep(profiles=["allow-all"], pre_dnat=[tier("allow-8080", "deny-peer",
                                                                egress=False)]))
    h.apply()
    assert h.to_host(src="198.18.0.50", proto=TCP, dport=9090) == "ACCEPT"
    assert h.to_host(proto=TCP, dport=9090) == "DROP"


def test_do_not_track_policy_in_raw(mode: str) -> None:
    h = HostHarness(mode)
    allow_udp = policy("allow-udp", inbound=[Rule(action="allow", protocol=UDP)],
                       outbound=[Rule(action="allow", protocol=UDP)], untracked=True)
    block = policy("block", inbound=[Rule(action="deny", protocol=TCP,
                                          dst_ports=(PortRange(2000, 2999),))], untracked=True)
    h.sync(allow_udp, block, DENY_ALL,
           hep(tiers=[tier("deny-all")], untracked=[tier("allow-udp", "block")]))
    before = len(h.walker.untracked)
    assert h.to_host(proto=UDP, dport=5000) == "ACCEPT"
    assert len(h.walker.untracked) == before + 1  # allowed AND not tracked
    assert h.from_host(proto=UDP, dport=5000) == "ACCEPT"
    assert h.to_host(proto=TCP, dport=2500) == "DROP"  # denied in raw
    assert h.to_host(proto=TCP, dport=3000) == "DROP"  # not matched: normal deny-all
    assert "cali-fh-eth0" in h.cmds.iptables.tables["raw"]


def test_untracked_deny_cannot_block_failsafes_or_their_replies(mode: str) -> None:
    h = HostHarness(mode)
    deny = policy("deny", inbound=[Rule(action="deny")], outbound=[Rule(action="deny")],
                  untracked=True)
    h.sync(deny, hep(untracked=[tier("deny")]))
    assert h.to_host(proto=TCP, dport=22) == "ACCEPT"
    assert h.to_host(proto=TCP, dport=23) == "DROP"
    # the reply of an outbound failsafe connection (BGP to a peer) comes back from port 179
    assert h.to_host(proto=TCP, sport=179, dport=40000, ctstate="ESTABLISHED") == "ACCEPT"
    assert h.to_host(proto=TCP, sport=180, dport=40000, ctstate="ESTABLISHED") == "DROP"


def test_apply_on_forward_policies_only_affect_forwarded_traffic(mode: str) -> None:
    h = HostHarness(mode)
    open_profile = ActiveProfileUpdate("open", Profile(inbound_rules=(Rule(action="allow"),),
                                                       outbound_rules=(Rule(action="allow"),)))
    no_ssh_fwd = policy("no-ssh-fwd", inbound=[Rule(action="deny", protocol=TCP,
                                                    dst_ports=(PortRange(22, 22),)),
                                               Rule(action="allow")],
                        apply_on_forward=True)
    h.sync(open_profile, endpoint("cali2", "10.65.0.2", profiles=["open"]), ALLOW_ALL,
           no_ssh_fwd,
           hep(profiles=["allow-all"], tiers=[tier("no-ssh-fwd", egress=False)],
               forward=[tier("no-ssh-fwd", egress=False)]))
    assert h.forward("eth0", "cali2", proto=TCP, dport=80) == "ACCEPT"
    assert h.forward("eth0", "cali2", proto=TCP, dport=22) == "DROP"
    assert h.forward("eth1", "cali2", proto=TCP, dport=22) == "ACCEPT"  # not via eth0
    # without forward policies, forwarded traffic through the host endpoint is not affected
    h.feed(hep(profiles=["allow-all"]))
    h.apply()
    assert h.forward("eth0", "cali2", proto=TCP, dport=22) == "ACCEPT"
    assert "cali-fhfw-eth0" not in h.cmds.iptables.chains


def test_expected_ips_resolve_to_the_interface_that_has_them(mode: str) -> None:
    h = HostHarness(mode)
    h.sync(hep(name="", ips=(HOST_IP,)))
    assert h.iptables.active_host_endpoints == {"eth0": HostEndpointID("node1-eth0")}
    assert h.to_host(proto=TCP, dport=80) == "DROP"
    # the address moves to eth1: the endpoint follows it
    h.feed(InterfaceAddrsUpdate("eth0", frozenset()),
           InterfaceAddrsUpdate("eth1", frozenset({f"{HOST_IP}/15"})))
    h.apply()
    assert h.iptables.active_host_endpoints == {"eth1": HostEndpointID("node1-eth0")}
    assert h.to_host(proto=TCP, dport=80) == "ACCEPT"
    assert h.to_host(iif="eth1", proto=TCP, dport=80) == "DROP"
    assert "cali-fh-eth0" not in h.cmds.iptables.chains


def test_wildcard_endpoint_covers_host_interfaces_but_not_loopback_or_workloads(mode: str) -> None:
    h = HostHarness(mode)
    h.sync(hep(name="*", hep_id="all"), hep(name="eth1", hep_id="eth1", profiles=["allow-all"]),
           ALLOW_ALL)
    assert h.to_host(iif="eth0", proto=TCP, dport=80) == "DROP"
    assert h.to_host(iif="eth7", proto=TCP, dport=80) == "DROP"
    assert h.to_host(iif="eth1", proto=TCP, dport=80) == "ACCEPT"  # its own endpoint first
    assert h.to_host(iif="lo", src="127.0.0.1", dst="127.0.0.1", proto=TCP, dport=80) == "ACCEPT"
    assert h.from_host(oif="cali5", proto=TCP, dport=80) == "ACCEPT"


def test_two_endpoints_claiming_one_interface_first_by_id_wins(mode: str) -> None:
    h = HostHarness(mode)
    h.sync(ALLOW_ALL, hep(hep_id="b-open", profiles=["allow-all"]), hep(hep_id="a-closed"))
    assert h.iptables.active_host_endpoints == {"eth0": HostEndpointID("a-closed")}
    assert h.to_host(proto=TCP, dport=80) == "DROP"
    h.feed(HostEndpointRemove(HostEndpointID("a-closed")))
    h.apply()
    assert h.to_host(proto=TCP, dport=80) == "ACCEPT"


def test_removing_the_endpoint_removes_its_chains_and_reapply_writes_nothing(mode: str) -> None:
    h = HostHarness(mode)
    h.sync(hep())
    assert "cali-fh-eth0" in h.cmds.iptables.chains
    restores = h.cmds.iptables.restore_calls
    h.apply()
    assert h.cmds.iptables.restore_calls == restores
    h.feed(HostEndpointRemove(HostEndpointID("node1-eth0")))
    h.apply()
    assert "cali-fh-eth0" not in h.cmds.iptables.chains
    assert "cali-th-eth0" not in h.cmds.iptables.chains
    assert h.to_host(proto=TCP, dport=80) == "ACCEPT"


def test_invalid_host_endpoint_interface_is_ignored(mode: str) -> None:
    h = HostHarness(mode)
    h.sync(hep(name="bad name!"), hep(name="cali123", hep_id="wl"))
    assert h.iptables.active_host_endpoints == {}
    assert h.to_host(proto=TCP, dport=80) == "ACCEPT"


@pytest.mark.parametrize(("action", "verdict"), [("Drop", "DROP"), ("Accept", "ACCEPT"),
                                                 ("Return", "ACCEPT")])
def test_default_endpoint_to_host_action(action: str, verdict: str) -> None:
    h = HostHarness(endpoint_to_host_action=action)
    h.sync(ALLOW_ALL, endpoint("cali1", "10.65.0.1", profiles=["allow-all"]))
    assert h.to_host(iif="cali1", src="10.65.0.1", proto=TCP, dport=80) == verdict
    # the datastore's spelling switches it live
    other = "Drop" if action != "Drop" else "Accept"
    h.feed(ConfigUpdate((("defaultEndpointToHostAction", other.lower()),)))
    h.apply()
    assert h.to_host(iif="cali1", src="10.65.0.1", proto=TCP, dport=80) == other.upper()
    h.feed(ConfigUpdate((("defaultEndpointToHostAction", action),)))
    h.apply()
    # a workload's egress policy still applies first
    h.feed(endpoint("cali1", "10.65.0.1"))
    h.apply()
    assert h.to_host(iif="cali1", src="10.65.0.1", proto=TCP, dport=80) == "DROP"


def test_return_action_hands_workload_traffic_back_to_input_not_to_host_endpoints() -> None:
    h = HostHarness(endpoint_to_host_action="Return")
    h.sync(ALLOW_ALL, endpoint("cali1", "10.65.0.1", profiles=["allow-all"]),
           hep(name="*", hep_id="all"))
    # a "*" host endpoint with no policy would drop; workload traffic never reaches it
    assert h.to_host(iif="cali1", src="10.65.0.1", proto=TCP, dport=80) == "ACCEPT"


def test_ipvs_service_addresses_are_not_host_ips_and_policy_still_applies() -> None:
    h = HostHarness(endpoint_to_host_action="Drop")
    vip = "10.96.0.10"
    ingress_web_only = policy("web-only", inbound=[Rule(action="allow", protocol=TCP,
                                                        dst_ports=(PortRange(80, 80),))])
    h.sync(ALLOW_ALL, ingress_web_only,
           endpoint("cali1", "10.65.0.1", profiles=["allow-all"]),
           endpoint("cali2", "10.65.0.2", tiers=[tier("web-only", egress=False)]),
           InterfaceUpdate("kube-ipvs0", 9, "down"),
           InterfaceAddrsUpdate("kube-ipvs0", frozenset({f"{vip}/32"})))
    assert h.iptables.ipvs_enabled
    assert h.cmds.ipset.members("cali40this-host") == {HOST_IP, "127.0.0.1"}
    # workload -> service VIP: egress policy applied, DefaultEndpointToHostAction not
    verdict, marked = h.walker.walk("INPUT", Packet(src="10.65.0.1", dst=vip, iif="cali1",
                                                    proto=TCP, dport=80))
    assert verdict == "ACCEPT"
    assert h.to_host(iif="cali1", src="10.65.0.1", proto=TCP, dport=80) == "DROP"  # host IP
    # IPVS forwards it to cali2 through OUTPUT: cali2's ingress policy applies
    to_pod = replace(marked, dst="10.65.0.2", oif="cali2", iif="")
    assert h.walker.verdict("OUTPUT", to_pod) == "ACCEPT"
    assert h.walker.verdict("OUTPUT", replace(to_pod, dport=81)) == "DROP"
    # the host's own traffic to a pod (no IPVS mark) is not subject to pod ingress policy
    assert h.walker.verdict("OUTPUT", Packet(src=HOST_IP, dst="10.65.0.2", oif="cali2",
                                             proto=TCP, dport=81)) == "ACCEPT"
    # a workload whose egress policy denies cannot reach the VIP either
    h.feed(endpoint("cali1", "10.65.0.1"))
    h.apply()
    assert h.walker.verdict("INPUT", Packet(src="10.65.0.1", dst=vip, iif="cali1",
                                            proto=TCP, dport=80)) == "DROP"
    # kube-ipvs0 goes: IPVS rules go, traffic to that address is host traffic again
    h.feed(ALLOW_ALL, endpoint("cali1", "10.65.0.1", profiles=["allow-all"]),
           InterfaceUpdate("kube-ipvs0", 9, IFACE_ABSENT),
           InterfaceAddrsUpdate("kube-ipvs0", None))
    h.apply()
    assert not h.iptables.ipvs_enabled
    assert h.walker.verdict("INPUT", Packet(src="10.65.0.1", dst=vip, iif="cali1",
                                            proto=TCP, dport=80)) == "DROP"


def test_vxlan_between_nodes_survives_a_deny_all_host_endpoint(mode: str) -> None:
    h = HostHarness(mode)
    vteps = [VXLANTunnelEndpointUpdate(node, f"02:00:00:00:00:0{i}", f"10.65.255.{i}",
                                       f"198.18.0.{i}") for i, node in ((1, "node1"), (2, "node2"))]
    h.sync(DENY_ALL, hep(tiers=[tier("deny-all")]), *vteps)
    assert h.cmds.ipset.members("cali40all-vxlan-net") == {"198.18.0.1", "198.18.0.2"}
    assert h.to_host(src="198.18.0.2", proto=UDP, dport=4789) == "ACCEPT"  # another node
    assert h.to_host(src="198.18.0.77", proto=UDP, dport=4789) == "DROP"  # not a node
    assert h.to_host(iif="eth1", src="198.18.0.77", proto=UDP, dport=4789) == "DROP"
    assert h.from_host(dst="198.18.0.2", proto=UDP, dport=4789) == "ACCEPT"
    assert h.from_host(dst="198.18.0.77", proto=UDP, dport=4789) == "DROP"  # deny-all
    # the last VTEP goes: the rules go, then the set
    h.feed(*(VXLANTunnelEndpointRemove(v.node) for v in vteps))
    h.apply()
    assert "cali40all-vxlan-net" not in h.cmds.ipset.sets
    assert h.to_host(iif="eth1", src="198.18.0.77", proto=UDP, dport=4789) == "ACCEPT"


def test_ipv6_only_vteps_are_not_ipv4_vxlan_sources(mode: str) -> None:
    h = HostHarness(mode)
    v6_only = VXLANTunnelEndpointUpdate("node2", "", "", "", ipv6_addr="fd00:65::ff:2",
                                        mac_v6="02:00:00:00:06:02",
                                        parent_device_ipv6="fd00:18::2")
    h.sync(v6_only)
    # no IPv4 VTEP anywhere: no IPv4 VXLAN rules, no set with an empty member
    assert "cali40all-vxlan-net" not in h.cmds.ipset.sets
    assert h.to_host(iif="eth1", src="198.18.0.77", proto=UDP, dport=4789) == "ACCEPT"
    h.feed(VXLANTunnelEndpointUpdate("node2", "02:00:00:00:00:02", "10.65.255.2",
                                     "198.18.0.2", ipv6_addr="fd00:65::ff:2",
                                     mac_v6="02:00:00:00:06:02",
                                     parent_device_ipv6="fd00:18::2"))
    h.apply()
    assert h.cmds.ipset.members("cali40all-vxlan-net") == {"198.18.0.2"}


def test_ipv6_vxlan_accepted_only_from_ipv6_vteps() -> None:
    """iptables mode: IPv6 VTEPs (vxlan-v6.calico) get Felix's IPv4 treatment in ip6tables:
    UDP to VXLANPort accepted from cali60all-vxlan-net (their parents' IPv6), others
    dropped; the rules and the set go with the last IPv6 VTEP."""
    h = HostHarness("iptables")
    walker6 = PacketWalker(h.cmds.iptables6, h.cmds.ipset)
    vteps = [VXLANTunnelEndpointUpdate(node, f"02:00:00:00:00:0{i}", f"10.65.255.{i}",
                                       f"198.18.0.{i}", ipv6_addr=f"fd00:65::ff:{i}",
                                       mac_v6=f"02:00:00:00:06:0{i}",
                                       parent_device_ipv6=f"fd00:18::{i}")
             for i, node in ((1, "node1"), (2, "node2"))]

    def to_host6(src: str) -> str:
        return walker6.verdict("INPUT", Packet(src=src, dst="fd00:18::1", iif="eth0",
                                               proto=UDP, dport=4789))

    h.sync(*vteps)
    assert h.cmds.ipset.members("cali60all-vxlan-net") == {"fd00:18::1", "fd00:18::2"}
    assert h.cmds.ipset.members("cali40all-vxlan-net") == {"198.18.0.1", "198.18.0.2"}
    assert to_host6("fd00:18::2") == "ACCEPT"  # another node's VTEP parent
    assert to_host6("fd00:18::77") == "DROP"  # not a node
    assert walker6.verdict("OUTPUT", Packet(src="fd00:18::1", dst="fd00:18::2", oif="eth0",
                                            proto=UDP, dport=4789)) == "ACCEPT"
    h.feed(*(VXLANTunnelEndpointRemove(v.node) for v in vteps))
    h.apply()
    assert "cali60all-vxlan-net" not in h.cmds.ipset.sets
    assert to_host6("fd00:18::77") == "ACCEPT"  # no VXLAN in use: not ours to judge


# --- BPF mode: iptables for host endpoints only ---------------------------------------------

WORKLOAD_CHAIN = re.compile(
    r"^cali-(tw|fw|ws)-|^cali-(from|to)-wl-dispatch$|^cali-wl-to-host$|^cali-wl-src-dispatch$")
WORKLOAD_IFACE = re.compile(r"(^| )-[io] cali\S*")
TARGET = re.compile(r" -[jg] (\S+)")


def our_sets(h: HostHarness | FakeCommands) -> set[str]:
    cmds = h.cmds if isinstance(h, HostHarness) else h
    return {name for name in cmds.ipset.sets if name.startswith(CALC_IPSET_PREFIXES)}


def test_bpf_mode_iptables_never_judges_workload_traffic() -> None:
    h = HostHarness("bpf")
    deny_wl = policy("wl-deny-all", inbound=[Rule(action="deny")],
                     outbound=[Rule(action="deny")])
    h.sync(DENY_ALL, deny_wl, hep(name="*", hep_id="all", tiers=[tier("deny-all")]),
           endpoint("cali1", "10.65.0.1", tiers=[tier("wl-deny-all")]),
           endpoint("cali2", "10.65.0.2", tiers=[tier("wl-deny-all")]))
    tables = h.cmds.iptables.tables
    # no workload chain (no source check either), and the workloads' policy is not rendered
    # (the tc programs have it); no IPv6 rules at all
    assert not [c for t in tables.values() for c in t if WORKLOAD_CHAIN.search(c)]
    assert not [c for t in h.cmds.iptables6.tables.values() for c in t if c.startswith("cali")]
    assert policy_chain_name("default", "wl-deny-all", inbound=True) not in tables["filter"]
    assert policy_chain_name("default", "deny-all", inbound=True) in tables["filter"]
    assert h.iptables.referenced_ip_sets() == frozenset()
    # every rule that names a workload interface hands the packet on without judging it
    for table in tables.values():
        for chain, rules in table.items():
            for rule in rules:
                if WORKLOAD_IFACE.search(rule):
                    target = TARGET.search(rule)
                    assert target and target.group(1) == "RETURN", (chain, rule)
    # so workload traffic passes iptables even under deny-all workload and "*" host policy
    pod1, pod2 = "10.65.0.1", "10.65.0.2"
    assert h.forward("cali1", "cali2", src=pod1, dst=pod2) == "ACCEPT"
    assert h.forward("cali1", "eth0", src=pod1, dst=PEER) == "ACCEPT"
    assert h.forward("eth0", "cali1", dst=pod1) == "ACCEPT"
    assert h.to_host(iif="cali1", src=pod1) == "ACCEPT"
    assert h.from_host(oif="cali1", dst=pod1) == "ACCEPT"
    # while the host's own traffic is judged: deny-all, failsafes
    assert h.to_host(proto=TCP, dport=80) == "DROP"
    assert h.to_host(iif="eth7", proto=TCP, dport=22) == "ACCEPT"
    assert h.from_host(proto=TCP, dport=80) == "DROP"


@pytest.mark.parametrize(("action", "verdict"), [("Drop", "DROP"), ("Return", "DROP"),
                                                 ("Accept", "ACCEPT")])
def test_bpf_mode_pod_to_host_is_handed_back_or_accepted_never_judged(action: str,
                                                                      verdict: str) -> None:
    """The tc program applied the pod's egress policy and the action (dropping on Drop);
    iptables returns pod->host packets to INPUT (here: the host's own DROP rule decides)
    or, for Accept, accepts them before the host's rules, as iptables mode does."""
    h = HostHarness("bpf", endpoint_to_host_action=action)
    h.sync(endpoint("cali1", "10.65.0.1"))  # no policy: iptables mode would drop it
    h.cmds.iptables.chains["INPUT"].append("-j DROP")  # the admin's own firewall
    assert h.to_host(iif="cali1", src="10.65.0.1", proto=TCP, dport=80) == verdict
    assert h.to_host(proto=TCP, dport=80) == "DROP"  # host traffic: the admin's rule
    # the datastore's spelling switches it live
    other = "Drop" if action == "Accept" else "Accept"
    h.feed(ConfigUpdate((("defaultEndpointToHostAction", other),)))
    h.apply()
    expected = "ACCEPT" if other == "Accept" else "DROP"
    assert h.to_host(iif="cali1", src="10.65.0.1", proto=TCP, dport=80) == expected


def test_bpf_mode_renders_only_what_host_endpoints_use_and_follows_them() -> None:
    h = HostHarness("bpf")
    admins, peers = "admins", "peers"
    allow_from = {name: policy(f"from-{name}", inbound=[
        Rule(action="allow", src_ip_set_ids=(name,))]) for name in (admins, peers)}
    h.sync(IPSetUpdate(admins, IPSET_TYPE_NET, frozenset({"198.18.7.0/24"})),
           IPSetUpdate(peers, IPSET_TYPE_NET, frozenset({PEER})), *allow_from.values(),
           endpoint("cali1", "10.65.0.1", tiers=[tier("from-peers", egress=False)]),
           hep(tiers=[tier("from-admins", egress=False)]))
    assert our_sets(h) == {ipset_name(admins, IPSET_TYPE_NET)}
    assert h.to_host(src="198.18.7.7", proto=TCP, dport=80) == "ACCEPT"
    assert h.to_host(proto=TCP, dport=80) == "DROP"  # PEER is not an admin
    # changes to a set no host endpoint rule uses write nothing
    writes = h.cmds.ipset.restore_calls
    h.feed(IPSetDeltaUpdate(peers, added=frozenset({"198.18.9.9"})))
    h.apply()
    assert h.cmds.ipset.restore_calls == writes
    # the host endpoint now lists the other policy: its set appears whole, before the rules
    # that match it; the unused one goes after them
    h.feed(hep(tiers=[tier("from-peers", egress=False)]))
    h.apply()
    assert our_sets(h) == {ipset_name(peers, IPSET_TYPE_NET)}
    assert h.cmds.ipset.members(ipset_name(peers, IPSET_TYPE_NET)) == {PEER, "198.18.9.9"}
    assert h.to_host(proto=TCP, dport=80) == "ACCEPT"
    assert h.to_host(src="198.18.9.9", proto=TCP, dport=80) == "ACCEPT"
    assert h.to_host(src="198.18.7.7", proto=TCP, dport=80) == "DROP"
    # the host endpoint goes: its policy's chains and set go too
    h.feed(HostEndpointRemove(HostEndpointID("node1-eth0")))
    h.apply()
    assert our_sets(h) == set()
    assert not [c for c in h.cmds.iptables.chains if c.startswith(("cali-pi-", "cali-po-"))]
    writes = (h.cmds.iptables.restore_calls, h.cmds.ipset.restore_calls)
    h.apply()
    assert (h.cmds.iptables.restore_calls, h.cmds.ipset.restore_calls) == writes


def test_switching_to_bpf_mode_sweeps_workload_chains_and_sets_keeps_host_endpoints() -> None:
    cmds = FakeCommands()
    state = [IPSetUpdate("peers", IPSET_TYPE_NET, frozenset({PEER})),
             policy("from-peers", inbound=[Rule(action="allow", src_ip_set_ids=("peers",))]),
             endpoint("cali1", "10.65.0.1", tiers=[tier("from-peers", egress=False)]),
             DENY_ALL, hep(tiers=[tier("deny-all")])]
    HostHarness("iptables", cmds=cmds).sync(*state)
    assert "cali-tw-cali1" in cmds.iptables.chains and our_sets(cmds)
    assert "cali-ws-cali1" in cmds.iptables.tables["raw"]
    assert "cali-FORWARD" in cmds.iptables6.chains
    h = HostHarness("bpf", cmds=cmds)  # the agent restarts with BPFEnabled
    h.sync(*state)
    assert not [c for t in cmds.iptables.tables.values() for c in t if WORKLOAD_CHAIN.search(c)]
    assert cmds.iptables6.user_chains() == set()
    assert our_sets(cmds) == set()
    assert h.to_host(proto=TCP, dport=80) == "DROP" and h.to_host(proto=TCP, dport=22) == "ACCEPT"
