"""Workload source check (anti-spoofing) in iptables mode: the raw table's
cali-wl-src-dispatch -> cali-ws-IF chains, rendered and programmed on FakeCommands and judged
by what they do to packets (PacketWalker: raw PREROUTING, mangle PREROUTING, then filter
FORWARD or INPUT, one packet and its mark carried along)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pyfelix.agent.dataplane.iptables.names import (
    CHAIN_PREROUTING,
    CHAIN_WL_SRC_DISPATCH,
    COMMENT_SPOOFED_SOURCE,
    COMMENT_UNKNOWN_WORKLOAD,
    MAX_CHAIN_NAME,
    source_check_chain_name,
)
from pyfelix.agent.dataplane.iptables.render import RuleRenderer, allowed_ipv4_sources
from pyfelix.agent.dataplane.managers.iptables import IptablesManager
from pyfelix.agent.proto import (
    ActivePolicyUpdate,
    ActiveProfileUpdate,
    HostEndpoint,
    HostEndpointID,
    HostEndpointUpdate,
    InSync,
    Policy,
    PolicyID,
    Profile,
    Rule,
    TierInfo,
    WorkloadEndpoint,
    WorkloadEndpointID,
    WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
)
from tests.fakes.commands import FakeCommands
from tests.fakes.netfilter import Packet, PacketWalker

A, B = "10.65.0.1", "10.65.0.2"
OUTSIDE = "203.0.113.9"
UDP = 17
ALLOW_ALL = ActiveProfileUpdate("allow-all", Profile(inbound_rules=(Rule(action="allow"),),
                                                     outbound_rules=(Rule(action="allow"),)))


def wep(iface: str, ip: str, *, spoof: tuple[str, ...] = (), ep: str | None = None
        ) -> WorkloadEndpointUpdate:
    return WorkloadEndpointUpdate(
        WorkloadEndpointID("k8s", f"ns/{ep or iface}", "eth0"),
        WorkloadEndpoint(state="active", name=iface, ipv4_nets=(f"{ip}/32",),
                         profile_ids=("allow-all",), allow_spoofed_source_prefixes=spoof))


class Node:
    """The iptables-mode manager on FakeCommands, with a packet walker over its tables."""

    def __init__(self, **kw: object) -> None:
        self.cmds = FakeCommands()
        self.iptables = IptablesManager(runner=self.cmds, **kw)  # type: ignore[arg-type]
        self.walker = PacketWalker(self.cmds.iptables, self.cmds.ipset)

    def sync(self, *msgs: object) -> None:
        for msg in (*msgs, InSync()):
            self.iptables.on_update(msg)
        self.iptables.apply()

    def update(self, *msgs: object) -> None:
        for msg in msgs:
            self.iptables.on_update(msg)
        self.iptables.apply()

    def raw(self, chain: str) -> list[str]:
        return self.cmds.iptables.tables["raw"][chain]

    def _walk(self, last: tuple[str, str], packet: Packet) -> str:
        verdict = "ACCEPT"
        for table, chain in (("raw", "PREROUTING"), ("mangle", "PREROUTING"), last):
            verdict, packet = self.walker.walk(chain, packet, table)
            if verdict == "DROP":
                return verdict
        return verdict

    def forward(self, src: str, iif: str = "cali1", oif: str = "cali2", dst: str = B,
                **kw: object) -> str:
        packet = Packet(src=src, dst=dst, iif=iif, oif=oif, **kw)  # type: ignore[arg-type]
        return self._walk(("filter", "FORWARD"), packet)

    def to_host(self, src: str, iif: str = "cali1", **kw: object) -> str:
        packet = Packet(src=src, dst="198.18.0.1", iif=iif, **kw)  # type: ignore[arg-type]
        return self._walk(("filter", "INPUT"), packet)

    def raw_verdict(self, src: str, iif: str) -> str:
        return self.walker.verdict("PREROUTING", Packet(src=src, dst=B, iif=iif), "raw")


# --- rendering ---------------------------------------------------------------------------------


def test_source_chain_returns_own_nets_and_allowed_ipv4_prefixes_then_drops_commented() -> None:
    endpoint = WorkloadEndpoint(state="active", name="cali1", ipv4_nets=("10.65.0.1/32",),
                                ipv6_nets=("fd00::1/128",),
                                allow_spoofed_source_prefixes=("203.0.113.7/24", "2001:db8::/64",
                                                               "10.65.0.1", "not-a-cidr"))
    chain = RuleRenderer.source_check_chain(endpoint)
    assert chain.name == "cali-ws-cali1" == source_check_chain_name("cali1")
    assert chain.rules == (
        "-s 10.65.0.1/32 -j RETURN",
        "-s 203.0.113.0/24 -j RETURN",  # normalised; the IPv6 and bad entries left out
        f'-m comment --comment "{COMMENT_SPOOFED_SOURCE}" -j DROP',
    )
    assert allowed_ipv4_sources(replace(endpoint, ipv4_nets=())) == ["203.0.113.0/24",
                                                                      "10.65.0.1/32"]
    # an endpoint with no IPv4 at all may send nothing
    assert RuleRenderer.source_check_chain(WorkloadEndpoint("active", "cali2")).rules == (
        f'-m comment --comment "{COMMENT_SPOOFED_SOURCE}" -j DROP',)
    assert len(source_check_chain_name("x" * 15)) <= MAX_CHAIN_NAME


def test_source_dispatch_sends_each_interface_to_its_chain_unknown_ones_drop() -> None:
    chain = RuleRenderer.source_dispatch_chain(["cali2", "cali1", "cali2"])
    assert chain.name == CHAIN_WL_SRC_DISPATCH
    assert chain.rules == ("-i cali1 -g cali-ws-cali1", "-i cali2 -g cali-ws-cali2",
                           f'-m comment --comment "{COMMENT_UNKNOWN_WORKLOAD}" -j DROP')


# --- programmed, judged by packets --------------------------------------------------------------


def test_forged_sources_from_a_workload_are_dropped_in_raw_genuine_ones_pass() -> None:
    node = Node(endpoint_to_host_action="Accept")
    node.sync(ALLOW_ALL, wep("cali1", A), wep("cali2", B))
    assert node.forward(A) == "ACCEPT"  # the path works
    assert node.forward(B) == "DROP"  # B's address, from A's interface
    assert node.forward(OUTSIDE) == "DROP"
    assert node.forward(B, iif="cali2", oif="cali1", dst=A) == "ACCEPT"
    assert node.to_host(A, proto=UDP) == "ACCEPT"
    assert node.to_host(OUTSIDE, proto=UDP) == "DROP"
    # it is the raw table that drops, naming why
    assert node.raw_verdict(OUTSIDE, "cali1") == "DROP"
    assert node.raw_verdict(A, "cali1") == "ACCEPT"
    assert COMMENT_SPOOFED_SOURCE in node.raw("cali-ws-cali1")[-1]
    assert node.raw("cali-ws-cali1")[-1].endswith("-j DROP")
    # host interfaces are not checked here (host endpoint policy / rp_filter's business)
    assert node.raw_verdict(OUTSIDE, "eth0") == "ACCEPT"
    assert node.forward(OUTSIDE, iif="eth0", oif="cali2") == "ACCEPT"


def test_workload_interface_without_endpoint_is_dropped_in_raw() -> None:
    node = Node()
    node.sync(ALLOW_ALL, wep("cali1", A))
    assert node.raw_verdict(A, "cali1") == "ACCEPT"
    assert node.raw_verdict("10.65.0.9", "cali9") == "DROP"
    assert COMMENT_UNKNOWN_WORKLOAD in node.raw(CHAIN_WL_SRC_DISPATCH)[-1]
    # before any endpoint exists too
    empty = Node()
    empty.sync()
    assert empty.raw_verdict(A, "cali1") == "DROP"


def test_allowed_spoofed_prefixes_pass_and_follow_endpoint_updates() -> None:
    node = Node()
    node.sync(ALLOW_ALL, wep("cali1", A, spoof=("203.0.113.0/24", "2001:db8::/64")),
              wep("cali2", B))
    assert node.forward(OUTSIDE) == "ACCEPT"
    assert node.forward("203.0.114.1") == "DROP"  # outside the allowed prefix
    assert node.forward(B) == "DROP"  # other pods' addresses stay forbidden
    assert node.forward(OUTSIDE, iif="cali2", oif="cali1", dst=A) == "DROP"  # A's, not B's
    # the prefix is withdrawn: dropped again; only the endpoint's chain is rewritten
    node.update(wep("cali1", A))
    assert node.forward(OUTSIDE) == "DROP"
    text = node.cmds.iptables.restore_inputs[-1]
    assert [ln for ln in text.splitlines() if ln.startswith(":")] == [":cali-ws-cali1 - [0:0]"]


def test_removed_endpoint_loses_its_chain_and_dispatch_entry_second_apply_is_a_no_op() -> None:
    node = Node()
    node.sync(ALLOW_ALL, wep("cali1", A), wep("cali2", B))
    node.update(WorkloadEndpointRemove(WorkloadEndpointID("k8s", "ns/cali2", "eth0")))
    assert "cali-ws-cali2" not in node.cmds.iptables.tables["raw"]
    assert not any("cali2" in rule for rule in node.raw(CHAIN_WL_SRC_DISPATCH))
    assert node.raw_verdict(B, "cali2") == "DROP"
    assert node.raw_verdict(A, "cali1") == "ACCEPT"
    calls = len(node.cmds.calls)
    node.iptables.apply()
    assert len(node.cmds.calls) == calls
    # an endpoint moving to another interface takes its chain along
    node.update(wep("cali7", A, ep="cali1"))
    assert "cali-ws-cali1" not in node.cmds.iptables.tables["raw"]
    assert node.raw_verdict(A, "cali7") == "ACCEPT" and node.raw_verdict(A, "cali1") == "DROP"


def test_source_check_comes_first_and_do_not_track_host_policy_still_works() -> None:
    node = Node()
    untracked = ActivePolicyUpdate(PolicyID("default", "no-ssh"), Policy(
        inbound_rules=(Rule(action="deny", protocol=6),), untracked=True))
    hep = HostEndpointUpdate(HostEndpointID("node1-eth0"), HostEndpoint(
        name="eth0", profile_ids=("allow-all",),
        untracked_tiers=(TierInfo("default", ingress_policies=("no-ssh",)),)))
    node.sync(ALLOW_ALL, untracked, hep, wep("cali1", A), wep("cali2", B))
    prerouting = node.raw(CHAIN_PREROUTING)
    assert prerouting[0].endswith(f"-i cali+ -j {CHAIN_WL_SRC_DISPATCH}")
    # the untracked deny on eth0 still drops in raw; workload traffic is still checked
    walk = node.walker.verdict
    assert walk("PREROUTING", Packet(src=OUTSIDE, dst="198.18.0.1", iif="eth0", proto=6,
                                     dport=8080), "raw") == "DROP"
    assert walk("PREROUTING", Packet(src=OUTSIDE, dst="198.18.0.1", iif="eth0", proto=UDP),
                "raw") == "ACCEPT"
    assert node.forward(A) == "ACCEPT" and node.forward(OUTSIDE) == "DROP"


def test_every_interface_prefix_is_checked() -> None:
    node = Node(interface_prefixes=("cali", "tap"))
    node.sync(ALLOW_ALL, wep("tap1", A))
    hooks = [r for r in node.raw(CHAIN_PREROUTING) if CHAIN_WL_SRC_DISPATCH in r]
    assert [h.split(" -j")[0].split()[-1] for h in hooks] == ["cali+", "tap+"]
    assert node.raw_verdict(A, "tap1") == "ACCEPT"
    assert node.raw_verdict(OUTSIDE, "tap1") == "DROP"
    assert node.raw_verdict(A, "tap2") == "DROP"


def test_bpf_mode_has_no_source_check_chains() -> None:
    node = Node(host_endpoints_only=True)
    node.sync(ALLOW_ALL, wep("cali1", A))
    raw = node.cmds.iptables.tables["raw"]
    assert CHAIN_WL_SRC_DISPATCH not in raw and "cali-ws-cali1" not in raw
    assert not any(CHAIN_WL_SRC_DISPATCH in rule for rule in raw[CHAIN_PREROUTING])
    assert node.raw_verdict(OUTSIDE, "cali1") == "ACCEPT"  # the tc programs check it


@pytest.mark.parametrize("restart_in", ["iptables", "bpf"])
def test_restart_adopts_or_sweeps_the_source_chains(restart_in: str) -> None:
    node = Node()
    node.sync(ALLOW_ALL, wep("cali1", A))
    again = IptablesManager(runner=node.cmds, host_endpoints_only=restart_in == "bpf")
    restores = node.cmds.iptables.restore_calls
    for msg in (ALLOW_ALL, wep("cali1", A), InSync()):
        again.on_update(msg)
    again.apply()
    raw = node.cmds.iptables.tables["raw"]
    if restart_in == "iptables":
        assert node.cmds.iptables.restore_calls == restores  # nothing to write
        assert "cali-ws-cali1" in raw
    else:
        assert "cali-ws-cali1" not in raw and CHAIN_WL_SRC_DISPATCH not in raw
