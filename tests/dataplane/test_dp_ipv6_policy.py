"""IPv6 policy in iptables mode: the ip6tables filter table's chains, rendered and
programmed on FakeCommands (ip6tables of the IPv4 backend, `cali60*` IP sets), judged by
PacketWalker: the same policy as IPv4, neighbour discovery first, a per-endpoint IPv6
source check; missing ip6tables or a kernel without IPv6 is an error (and, kept up, the
loop fails closed); BPF mode installs nothing and sweeps what an iptables-mode agent left."""

from __future__ import annotations

import random

import pytest

from pyfelix.agent.dataplane.iptables.ipv6 import (
    ICMPV6_FROM_HOST,
    ICMPV6_TO_HOST,
    ipv6_base_chain_inserts,
    ipv6_workload_static_chains,
)
from pyfelix.agent.dataplane.iptables.names import COMMENT_IPV6_DISABLED, COMMENT_SPOOFED_SOURCE
from pyfelix.agent.dataplane.iptables.render import RuleRenderer
from pyfelix.agent.dataplane.iptables.restore import (
    BACKENDS,
    BACKENDS6,
    IptablesBinaries,
    IptablesError,
    parse_save,
)
from pyfelix.agent.dataplane.loop import DataplaneLoop
from pyfelix.agent.dataplane.managers.ipsets import IPSetsManager
from pyfelix.agent.dataplane.managers.iptables import IptablesManager
from pyfelix.agent.proto import (
    ActivePolicyUpdate,
    ActiveProfileUpdate,
    InSync,
    IPSetUpdate,
    Policy,
    PolicyID,
    PortRange,
    Profile,
    Rule,
    TierInfo,
    WorkloadEndpoint,
    WorkloadEndpointID,
    WorkloadEndpointUpdate,
)
from tests.fakes.clock import FakeClock
from tests.fakes.commands import FakeCommands
from tests.fakes.netfilter import Packet, PacketWalker

A6, B6, HOST6, OUT6 = "fd00:65::1", "fd00:65::2", "fe80::1", "2001:db8::9"
ICMPV6, TCP, UDP = 58, 6, 17
ALLOW_ALL = ActiveProfileUpdate("allow-all", Profile(inbound_rules=(Rule(action="allow"),),
                                                     outbound_rules=(Rule(action="allow"),)))


def wep(iface: str, ip: str, ip6: str, *, tiers: tuple[TierInfo, ...] = (),
        profiles: tuple[str, ...] = ("allow-all",)) -> WorkloadEndpointUpdate:
    return WorkloadEndpointUpdate(
        WorkloadEndpointID("k8s", f"ns/{iface}", "eth0"),
        WorkloadEndpoint(state="active", name=iface, ipv4_nets=(f"{ip}/32",),
                         ipv6_nets=(f"{ip6}/128",), profile_ids=profiles, tiers=tiers))


STATE = (ALLOW_ALL, wep("cali1", "10.65.0.1", A6), wep("cali2", "10.65.0.2", B6))


def manager(cmds: FakeCommands, **kw: object) -> IptablesManager:
    m = IptablesManager(runner=cmds, **kw)  # type: ignore[arg-type]
    for msg in (*STATE, InSync()):
        m.on_update(msg)
    return m


def synced(**kw: object) -> tuple[FakeCommands, IptablesManager]:
    cmds = FakeCommands()
    m = manager(cmds, **kw)
    m.apply()
    return cmds, m


def walker6(cmds: FakeCommands) -> PacketWalker:
    return PacketWalker(cmds.iptables6, cmds.ipset)


# --- rendering ---------------------------------------------------------------------------------


def test_static_chains_accept_nd_and_mld_then_send_workloads_to_their_policy() -> None:
    renderer = RuleRenderer(interface_prefixes=("cali", "tap"), family=6)
    chains = {c.name: c.rules for c in ipv6_workload_static_chains(renderer)}
    assert set(chains) == {"cali-INPUT", "cali-FORWARD", "cali-wl-to-host", "cali-OUTPUT"}
    assert chains["cali-FORWARD"][1:] == (
        "-i cali+ -j cali-from-wl-dispatch", "-i tap+ -j cali-from-wl-dispatch",
        "-o cali+ -j cali-to-wl-dispatch", "-o tap+ -j cali-to-wl-dispatch",
        "-m mark --mark 0x10000/0x10000 -j ACCEPT")
    assert chains["cali-wl-to-host"] == ("-j cali-from-wl-dispatch", "-j DROP")
    for name, flag, types in (("cali-INPUT", "-i", ICMPV6_TO_HOST),
                              ("cali-OUTPUT", "-o", ICMPV6_FROM_HOST)):
        rules = chains[name]
        for prefix in ("cali", "tap"):
            accepts = [r for r in rules if r.startswith(f"{flag} {prefix}+ -p ipv6-icmp")]
            assert [int(r.split("--icmpv6-type ")[1].split()[0]) for r in accepts] == \
                list(types)
        # neighbour discovery first, before anything judges the packet
        assert all("ipv6-icmp" in r for r in rules[:2 * len(types)])
    assert chains["cali-INPUT"][-2:] == ("-i cali+ -g cali-wl-to-host",
                                         "-i tap+ -g cali-wl-to-host")
    assert set(ICMPV6_TO_HOST) ^ set(ICMPV6_FROM_HOST) == {133, 134}  # RS up, RA down
    assert ipv6_base_chain_inserts() == {"INPUT": ("-j cali-INPUT",),
                                         "FORWARD": ("-j cali-FORWARD",),
                                         "OUTPUT": ("-j cali-OUTPUT",)}
    with pytest.raises(ValueError, match="IPv6 renderer"):
        ipv6_workload_static_chains(RuleRenderer())


def test_rules_render_per_family() -> None:
    v4, v6 = RuleRenderer(), RuleRenderer(family=6)
    icmp6 = Rule(action="allow", protocol=ICMPV6, icmp_type=128, icmp_code=0)
    assert v4.render_rule(icmp6) == []
    assert v6.render_rule(icmp6)[0].startswith("-p ipv6-icmp -m icmp6 --icmpv6-type 128/0 ")
    icmp4 = Rule(action="allow", protocol=1, icmp_type=8)
    assert v6.render_rule(icmp4) == [] and v4.render_rule(icmp4)
    only4 = Rule(action="deny", ip_version=4)
    assert v6.render_rule(only4) == [] and v4.render_rule(only4) == ["-j DROP"]
    mixed_not = Rule(action="allow", not_src_nets=("10.0.0.0/8", "fd00::/8"))
    assert v6.render_rule(mixed_not)[0].startswith("! -s fd00::/8 ")
    assert v4.render_rule(mixed_not)[0].startswith("! -s 10.0.0.0/8 ")
    nets6 = Rule(action="allow", src_nets=("fd00:1::/64",))
    assert v4.render_rule(nets6) == [] and "-s fd00:1::/64" in v6.render_rule(nets6)[0]
    sets = Rule(action="allow", src_ip_set_ids=("s",))
    assert "cali60s:" in v6.render_rule(sets)[0] and "cali40s:" in v4.render_rule(sets)[0]


def test_ipv6_binaries_are_the_ip6tables_twins_of_the_same_backend() -> None:
    assert BACKENDS6["nft"] == IptablesBinaries("ip6tables-nft-save", "ip6tables-nft-restore",
                                                "nft", family=6)
    assert BACKENDS6["legacy"].restore == "ip6tables-legacy-restore"
    assert IptablesBinaries().ipv6() == IptablesBinaries("ip6tables-save", "ip6tables-restore",
                                                         "default", family=6)
    assert IptablesBinaries("/usr/sbin/iptables-save", "/usr/sbin/iptables-restore").ipv6() \
        .save == "/usr/sbin/ip6tables-save"
    assert BACKENDS6["nft"].ipv6() == BACKENDS6["nft"]
    with pytest.raises(ValueError, match="ip6tables twin"):
        IptablesBinaries("my-save", "my-restore").ipv6()


# --- programmed, judged by packets --------------------------------------------------------------


def _policed(state: tuple[object, ...]) -> FakeCommands:
    """IP sets (both families) and iptables managers over `state`, one round applied."""
    cmds = FakeCommands()
    ipsets, iptables = IPSetsManager(runner=cmds), IptablesManager(runner=cmds)
    for msg in (*state, InSync()):
        ipsets.on_update(msg)
        iptables.on_update(msg)
    ipsets.apply()
    iptables.apply()
    ipsets.finish_apply()
    return cmds


def test_ipv6_between_workloads_follows_their_policy() -> None:
    web = ActivePolicyUpdate(PolicyID("default", "web"), Policy(inbound_rules=(
        Rule(action="allow", protocol=TCP, src_ip_set_ids=("clients",),
             dst_ports=(PortRange(80, 80),)),
        Rule(action="allow", protocol=ICMPV6, icmp_type=128),
        Rule(action="allow", ip_version=4))))  # IPv4 only: never opens IPv6
    tiers = (TierInfo("default", ingress_policies=("web",)),)
    cmds = _policed((ALLOW_ALL, IPSetUpdate("clients", "net", frozenset({"10.65.0.1/32",
                                                                         f"{A6}/128"})),
                     web, wep("cali1", "10.65.0.1", A6),
                     wep("cali2", "10.65.0.2", B6, tiers=tiers)))
    w = walker6(cmds)
    assert cmds.ipset.sets[next(n for n in cmds.ipset.sets if n.startswith("cali60s:"))][1] \
        == {A6}
    assert w.verdict("FORWARD", Packet(src=A6, dst=B6, iif="cali1", oif="cali2", proto=TCP,
                                       dport=80)) == "ACCEPT"
    assert w.verdict("FORWARD", Packet(src=A6, dst=B6, iif="cali1", oif="cali2", proto=TCP,
                                       dport=81)) == "DROP"
    assert w.verdict("FORWARD", Packet(src=A6, dst=B6, iif="cali1", oif="cali2", proto=UDP,
                                       dport=80)) == "DROP"
    assert w.verdict("FORWARD", Packet(src=A6, dst=B6, iif="cali1", oif="cali2",
                                       proto=ICMPV6, icmp_type=128)) == "ACCEPT"
    assert w.verdict("FORWARD", Packet(src=A6, dst=B6, iif="cali1", oif="cali2",
                                       proto=ICMPV6, icmp_type=129)) == "DROP"
    # the IPv4 side: the ipVersion 4 allow opens everything there
    v4 = PacketWalker(cmds.iptables, cmds.ipset)
    assert v4.verdict("FORWARD", Packet(src="10.65.0.1", dst="10.65.0.2", iif="cali1",
                                        oif="cali2", proto=UDP, dport=80)) == "ACCEPT"
    # B -> A: A's allow-all profile; to the outside: A's egress (allow-all)
    assert w.verdict("FORWARD", Packet(src=B6, dst=A6, iif="cali2", oif="cali1",
                                       proto=UDP)) == "ACCEPT"
    assert w.verdict("FORWARD", Packet(src=A6, dst=OUT6, iif="cali1", oif="eth0")) == "ACCEPT"


def test_ipv6_source_check_neighbour_discovery_and_the_host() -> None:
    cmds = _policed(STATE)
    w = walker6(cmds)
    # a source that is not the workload's own IPv6 address: dropped, counted, commented
    for forged in (B6, OUT6, "fd00:65::99"):
        assert w.verdict("FORWARD", Packet(src=forged, dst=B6, iif="cali1", oif="cali2",
                                           proto=UDP)) == "DROP", forged
    ws = cmds.iptables6.chains["cali-ws-cali1"]  # as saved: our hash comment first
    assert ws[0].endswith(f"-s {A6}/128 -j RETURN") and COMMENT_SPOOFED_SOURCE in ws[-1]
    assert cmds.iptables6.chains["cali-fw-cali1"][0].endswith("-j cali-ws-cali1")
    # an interface of ours without an endpoint
    assert w.verdict("FORWARD", Packet(src=A6, dst=B6, iif="cali9", oif="cali2")) == "DROP"
    # workload -> host: ND/MLD yes; anything else goes through the workload's egress policy
    # and then DefaultEndpointToHostAction (Drop)
    for icmp_type in ICMPV6_TO_HOST:
        assert w.verdict("INPUT", Packet(src=A6, dst=HOST6, iif="cali1", proto=ICMPV6,
                                         icmp_type=icmp_type)) == "ACCEPT", icmp_type
    assert w.verdict("INPUT", Packet(src=A6, dst=HOST6, iif="cali1", proto=TCP)) == "DROP"
    # host -> workload: ND/MLD and router advertisements, and the host's own packets
    for icmp_type in ICMPV6_FROM_HOST:
        assert w.verdict("OUTPUT", Packet(src=HOST6, dst=A6, oif="cali1", proto=ICMPV6,
                                          icmp_type=icmp_type)) == "ACCEPT", icmp_type
    # the host's own IPv6 is not ours to judge
    assert w.verdict("INPUT", Packet(src=OUT6, dst=HOST6, iif="eth0", proto=TCP)) == "ACCEPT"
    assert w.verdict("OUTPUT", Packet(src=HOST6, dst=OUT6, oif="eth0", proto=TCP)) == "ACCEPT"
    assert w.verdict("FORWARD", Packet(src=OUT6, dst="2001:db8:1::1", iif="eth0",
                                       oif="eth1")) == "ACCEPT"


def test_ipv6_table_uses_the_ipv4_backend_and_is_written_by_ip6tables_restore() -> None:
    cmds = FakeCommands()
    cmds.backends["legacy"].chains["INPUT"] = ["-j ACCEPT"]  # the namespace uses legacy
    m = manager(cmds)
    m.apply()
    assert m.table6.binaries == BACKENDS6["legacy"] and m.table.binaries == BACKENDS["legacy"]
    assert "cali-FORWARD" in cmds.backends6["legacy"].user_chains()
    assert cmds.backends6["nft"].user_chains() == set()
    assert cmds.backends6["legacy"].chains["FORWARD"][0].endswith("-j cali-FORWARD")
    restores = [c for c in cmds.calls if c[0].endswith("-restore")]
    assert [c[0] for c in restores] == ["iptables-legacy-restore", "ip6tables-legacy-restore"]
    # one manager-level table object per family, same chain names in both
    assert parse_save(cmds.backends6["legacy"].save("filter")).chains["cali-FORWARD"] == \
        m.table6.desired_chain("cali-FORWARD").hashes  # type: ignore[union-attr]


def test_second_apply_resync_and_restart_write_nothing_drift_is_repaired() -> None:
    cmds, m = synced()
    v6 = cmds.iptables6
    assert v6.restore_calls == 1
    calls = len(cmds.calls)
    m.apply()
    assert len(cmds.calls) == calls
    m.request_resync()
    m.apply()
    assert v6.restore_calls == 1 and v6.save_calls >= 2
    again = manager(cmds)
    again.apply()
    assert v6.restore_calls == 1
    # drift: someone removes our FORWARD jump and flushes cali-INPUT
    v6.chains["FORWARD"].pop(0)
    v6.chains["cali-INPUT"].clear()
    m.request_resync()
    m.apply()
    assert v6.restore_calls == 2
    assert v6.chains["FORWARD"][0].endswith("-j cali-FORWARD")
    assert walker6(cmds).verdict("FORWARD", Packet(src=A6, dst=B6, iif="cali1",
                                                   oif="cali2")) == "ACCEPT"  # allow-all
    assert walker6(cmds).verdict("INPUT", Packet(src=A6, dst=HOST6, iif="cali1",
                                                 proto=TCP)) == "DROP"  # endpoint to host


@pytest.mark.parametrize("broken", ["missing", "no-ipv6-kernel"])
def test_no_ip6tables_is_a_clear_error_ipv4_still_programmed_and_recovers(broken: str) -> None:
    cmds = FakeCommands()
    if broken == "missing":
        cmds.ip6tables_missing = True
    else:
        cmds.ipv6_kernel = False
    m = manager(cmds)
    with pytest.raises(IptablesError, match=r"IPv6: .*ip6tables-restore must be installed and "
                                            r"IPv6 enabled in the kernel") as info:
        m.apply()
    assert ("not found" if broken == "missing" else "Address family not supported") \
        in str(info.value)
    assert "cali-FORWARD" in cmds.iptables.user_chains()  # IPv4 was programmed regardless
    with pytest.raises(IptablesError, match="IPv6"):
        m.apply()  # retried, still failing: never reported as done
    cmds.ip6tables_missing, cmds.ipv6_kernel = False, True
    m.apply()
    assert "cali-FORWARD" in cmds.iptables6.user_chains()


def test_ipv4_and_ipv6_failures_are_both_reported() -> None:
    cmds = FakeCommands()
    cmds.ip6tables_missing = True
    cmds.iptables.fail_next()
    m = manager(cmds)
    with pytest.raises(IptablesError, match=r"^IPv4: .*injected failure.*; IPv6: "):
        m.apply()


def test_missing_ip6tables_kept_up_makes_the_loop_fail_closed() -> None:
    cmds = FakeCommands()
    cmds.ip6tables_missing = True
    clock = FakeClock()
    reasons: list[str] = []
    loop = DataplaneLoop([IptablesManager(runner=cmds)], clock=clock, rng=random.Random(1),
                         fail_closed_after=10.0, retry_max=2.0, on_fatal=reasons.append)
    for msg in (*STATE, InSync()):
        loop.enqueue(msg)
    while not loop.fatal.is_set():
        loop.run_once()
        assert clock.monotonic() < 1000.0 + 60, "never failed closed"
        if loop.next_retry_at is not None:
            clock.advance(max(0.0, loop.next_retry_at - clock.monotonic()))
    assert len(reasons) == 1 and "IPv6: " in reasons[0] and "ip6tables" in reasons[0]
    assert not loop.in_sync.is_set()


# --- BPF mode ------------------------------------------------------------------------------------


def test_bpf_mode_installs_no_ipv6_rules_and_needs_no_ip6tables() -> None:
    cmds = FakeCommands()
    cmds.ip6tables_missing = True
    m = manager(cmds, host_endpoints_only=True)
    m.apply()  # no error: the tc programs police workload IPv6
    m.apply()
    assert cmds.iptables6.user_chains() == set()
    assert cmds.iptables6.restore_calls == 0
    assert sum(1 for c in cmds.calls if c[0].startswith("ip6tables")) == 1  # the one sweep


def test_bpf_mode_sweeps_the_ipv6_chains_an_iptables_mode_agent_left_once() -> None:
    cmds, _ = synced()
    cmds.iptables6.chains["INPUT"].append("-j ACCEPT")  # not ours: stays
    assert "cali-FORWARD" in cmds.iptables6.user_chains()
    bpf = manager(cmds, host_endpoints_only=True)
    bpf.apply()
    assert cmds.iptables6.user_chains() == set()
    assert cmds.iptables6.chains["INPUT"] == ["-j ACCEPT"]
    assert cmds.iptables6.chains["FORWARD"] == []
    assert walker6(cmds).verdict("FORWARD", Packet(src=A6, dst=B6, iif="cali1",
                                                   oif="cali2")) == "ACCEPT"
    calls = len(cmds.calls)
    bpf.request_resync()
    bpf.apply()
    assert not [c for c in cmds.calls[calls:] if c[0].startswith("ip6tables")]


def test_bpf_mode_sweep_waits_for_insync() -> None:
    cmds, _ = synced()
    bpf = IptablesManager(runner=cmds, host_endpoints_only=True)
    for msg in STATE:
        bpf.on_update(msg)
    bpf.apply()
    assert "cali-FORWARD" in cmds.iptables6.user_chains()
    bpf.on_update(InSync())
    bpf.apply()
    assert cmds.iptables6.user_chains() == set()


def test_ipv6_support_false_renders_only_drops_and_keeps_ipv6_sets_out() -> None:
    """Ipv6Support false: no IPv6 policy, endpoint or dispatch chain and no cali60 set;
    workload IPv6 dropped in every direction (ND/MLD still accepted), IPv4 unchanged."""
    cmds = FakeCommands()
    ipsets = IPSetsManager(runner=cmds, families=(4,))
    iptables = IptablesManager(runner=cmds, ipv6_policy=False)
    state = (ALLOW_ALL, IPSetUpdate("clients", "net", frozenset({"10.65.0.1/32", f"{A6}/128"})),
             wep("cali1", "10.65.0.1", A6), wep("cali2", "10.65.0.2", B6), InSync())
    for msg in state:
        ipsets.on_update(msg)
        iptables.on_update(msg)
    ipsets.apply()
    iptables.apply()
    ipsets.finish_apply()
    assert [n for n in cmds.ipset.sets if n.startswith("cali60")] == []
    assert [n for n in cmds.ipset.sets if n.startswith("cali40s:")]
    chains6 = set(cmds.iptables6.tables["filter"])
    assert {c for c in chains6 if c.startswith("cali-")} == {"cali-FORWARD", "cali-INPUT",
                                                            "cali-OUTPUT"}
    w = walker6(cmds)
    for packet in (Packet(src=A6, dst=B6, iif="cali1", oif="cali2", proto=UDP, dport=80),
                   Packet(src=A6, dst=OUT6, iif="cali1", oif="eth0", proto=TCP, dport=80),
                   Packet(src=OUT6, dst=B6, iif="eth0", oif="cali2", proto=TCP, dport=80)):
        assert w.verdict("FORWARD", packet) == "DROP", packet
    assert w.verdict("INPUT", Packet(src=A6, dst=HOST6, iif="cali1", proto=UDP,
                                     dport=53)) == "DROP"
    assert w.verdict("OUTPUT", Packet(src=HOST6, dst=A6, oif="cali1", proto=UDP,
                                      dport=53)) == "DROP"
    assert w.verdict("INPUT", Packet(src=HOST6, dst=HOST6, iif="cali1", proto=ICMPV6,
                                     icmp_type=135)) == "ACCEPT"
    assert all(COMMENT_IPV6_DISABLED in rule
               for rule in cmds.iptables6.tables["filter"]["cali-FORWARD"])
    v4 = PacketWalker(cmds.iptables, cmds.ipset)
    assert v4.verdict("FORWARD", Packet(src="10.65.0.1", dst="10.65.0.2", iif="cali1",
                                        oif="cali2", proto=UDP, dport=80)) == "ACCEPT"
