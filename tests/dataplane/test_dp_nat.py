"""NAT-outgoing manager on fakes: what the nat tables (IPv4 and IPv6) DO to packets, by pool
configuration; floating IPs' DNAT/SNAT rules per family; nothing IPv6 with Ipv6Support off."""

from __future__ import annotations

import pytest

from pyfelix.agent.dataplane.managers.nat import NatOutgoingManager
from pyfelix.agent.proto import InSync, IPAMPoolRemove, IPAMPoolUpdate
from pyfelix.agent.shims.cmd import CommandError
from tests.fakes.commands import FakeCommands
from tests.fakes.netfilter import Packet, PacketWalker


def _pool(cidr: str, masq: bool) -> IPAMPoolUpdate:
    return IPAMPoolUpdate(id=cidr, cidr=cidr, masquerade=masq)


class NatHarness:
    def __init__(self, **kwargs: bool) -> None:
        self.cmds = FakeCommands()
        self.mgr = NatOutgoingManager(runner=self.cmds, **kwargs)
        self.walker = PacketWalker(self.cmds.iptables, self.cmds.ipset)
        self.walker6 = PacketWalker(self.cmds.iptables6, self.cmds.ipset)

    def sync(self, *msgs: object) -> None:
        for msg in (*msgs, InSync()):
            self.mgr.on_update(msg)
        self.round()

    def round(self) -> None:
        self.mgr.apply()
        self.mgr.finish_apply()

    def postrouting(self, src: str, dst: str) -> str:
        return self.walker.verdict("POSTROUTING", Packet(src=src, dst=dst), table="nat")

    def postrouting6(self, src: str, dst: str) -> str:
        return self.walker6.verdict("POSTROUTING", Packet(src=src, dst=dst), table="nat")


def test_masquerades_only_natoutgoing_pools_to_outside_all_pools() -> None:
    h = NatHarness()
    h.sync(_pool("10.65.0.0/16", True), _pool("10.70.0.0/16", False))
    assert h.postrouting("10.65.0.5", "198.51.100.7") == "MASQUERADE"
    assert h.postrouting("10.65.0.5", "10.65.3.1") == "ACCEPT"  # inside its own pool
    assert h.postrouting("10.65.0.5", "10.70.0.9") == "ACCEPT"  # to another pool
    assert h.postrouting("10.70.0.9", "198.51.100.7") == "ACCEPT"  # pool without natOutgoing
    assert h.postrouting("198.18.0.1", "198.51.100.7") == "ACCEPT"  # host traffic
    assert h.cmds.ipset.members("cali40all-ipam-pools") == {"10.65.0.0/16", "10.70.0.0/16"}
    assert h.cmds.ipset.members("cali40masq-ipam-pools") == {"10.65.0.0/16"}


def test_turning_natoutgoing_off_and_removing_pools() -> None:
    h = NatHarness()
    h.sync(_pool("10.65.0.0/16", True))
    assert h.postrouting("10.65.0.5", "8.8.8.8") == "MASQUERADE"
    h.mgr.on_update(_pool("10.65.0.0/16", False))
    h.round()
    assert h.postrouting("10.65.0.5", "8.8.8.8") == "ACCEPT"
    assert h.cmds.iptables.tables["nat"]["cali-nat-outgoing"] == []
    h.mgr.on_update(_pool("10.65.0.0/16", True))
    h.mgr.on_update(IPAMPoolRemove(id="10.65.0.0/16"))
    h.round()
    assert h.postrouting("10.65.0.5", "8.8.8.8") == "ACCEPT"
    assert h.cmds.ipset.members("cali40all-ipam-pools") == set()


def test_second_apply_writes_nothing_and_drift_is_repaired() -> None:
    h = NatHarness()
    h.sync(_pool("10.65.0.0/16", True))
    restores = h.cmds.iptables.restore_calls + h.cmds.ipset.restore_calls
    h.round()
    assert h.cmds.iptables.restore_calls + h.cmds.ipset.restore_calls == restores
    # someone flushes our chain and empties a set: the periodic resync puts them back
    h.cmds.iptables.tables["nat"]["cali-nat-outgoing"].clear()
    h.cmds.ipset.sets["cali40masq-ipam-pools"][1].clear()
    h.mgr.request_resync()
    h.round()
    assert h.postrouting("10.65.0.5", "8.8.8.8") == "MASQUERADE"


def test_insert_sits_at_top_of_postrouting_beside_foreign_rules() -> None:
    h = NatHarness()
    h.cmds.iptables.restore("*nat\n-A POSTROUTING -j ACCEPT\nCOMMIT\n", noflush=True)
    h.sync(_pool("10.65.0.0/16", True))
    assert h.cmds.iptables.tables["nat"]["POSTROUTING"][0].endswith("-j cali-POSTROUTING")
    assert h.cmds.iptables.tables["nat"]["POSTROUTING"][1] == "-j ACCEPT"
    assert h.postrouting("10.65.0.5", "8.8.8.8") == "MASQUERADE"


def test_failure_keeps_work_pending_and_retries() -> None:
    h = NatHarness()
    for msg in (_pool("10.65.0.0/16", True), InSync()):
        h.mgr.on_update(msg)
    h.cmds.iptables.fail_next()
    with pytest.raises(Exception, match="injected"):
        h.round()
    assert "cali-nat-outgoing" not in h.cmds.iptables.tables["nat"]
    h.round()
    assert h.postrouting("10.65.0.5", "8.8.8.8") == "MASQUERADE"


def test_bad_pools_are_ignored_and_each_family_has_its_own_sets() -> None:
    h = NatHarness()
    h.sync(IPAMPoolUpdate(id="bad", cidr="not-a-cidr", masquerade=True),
           _pool("fd00::/64", True), _pool("10.65.0.0/16", True))
    assert h.mgr.masquerading_pools(4) == ["10.65.0.0/16"]
    assert h.mgr.masquerading_pools(6) == ["fd00::/64"]
    assert h.cmds.ipset.members("cali40all-ipam-pools") == {"10.65.0.0/16"}
    assert h.cmds.ipset.members("cali60all-ipam-pools") == {"fd00::/64"}
    assert h.cmds.ipset.members("cali60masq-ipam-pools") == {"fd00::/64"}


def test_ipv6_nat_outgoing_masquerades_in_ip6tables_as_ipv4_does() -> None:
    h = NatHarness()
    h.sync(_pool("fd65::/64", True), _pool("fd70::/64", False), _pool("10.65.0.0/16", False))
    assert h.postrouting6("fd65::5", "2001:db8::7") == "MASQUERADE"
    assert h.postrouting6("fd65::5", "fd65::9") == "ACCEPT"  # inside its own pool
    assert h.postrouting6("fd65::5", "fd70::9") == "ACCEPT"  # to another pool
    assert h.postrouting6("fd70::9", "2001:db8::7") == "ACCEPT"  # pool without natOutgoing
    assert h.postrouting6("fd00:198:18::1", "2001:db8::7") == "ACCEPT"  # host traffic
    # the IPv4 pool has no natOutgoing: the IPv4 chain has no rule at all
    assert h.cmds.iptables.tables["nat"]["cali-nat-outgoing"] == []
    assert _rules(h.cmds.iptables6.tables["nat"]["cali-nat-outgoing"]) == [
        "-m set --match-set cali60masq-ipam-pools src "
        "-m set ! --match-set cali60all-ipam-pools dst -j MASQUERADE"]
    # natOutgoing off: the IPv6 rule goes, the sets stay (the pools still exist)
    h.mgr.on_update(_pool("fd65::/64", False))
    h.round()
    assert h.postrouting6("fd65::5", "2001:db8::7") == "ACCEPT"
    assert h.cmds.ipset.members("cali60masq-ipam-pools") == set()


def test_ipv6_support_false_programs_nothing_ipv6() -> None:
    h = NatHarness(ipv6=False, floating_ips=True)
    h.sync(_pool("fd65::/64", True), _pool("10.65.0.0/16", True),
           _wep("a", "10.65.0.1", "10.65.200.1", ip6="fd65::1", fips6=("fd65::c8:1",)))
    assert h.postrouting("10.65.0.5", "8.8.8.8") == "MASQUERADE"
    assert h.mgr.masquerading_pools() == ["10.65.0.0/16"]
    assert [nat.ext_ip for nat in h.mgr.floating_ips()] == ["10.65.200.1"]
    assert not [argv for argv in h.cmds.calls if argv[0].startswith("ip6tables")]
    assert not [name for name in h.cmds.ipset.sets if name.startswith("cali60")]


def test_ipv6_nat_failure_does_not_stop_ipv4_and_is_raised() -> None:
    h = NatHarness()
    h.cmds.ip6tables_missing = True
    for msg in (_pool("10.65.0.0/16", True), _pool("fd65::/64", True), InSync()):
        h.mgr.on_update(msg)
    with pytest.raises(Exception, match="IPv6 nat table"):
        h.round()
    assert h.postrouting("10.65.0.5", "8.8.8.8") == "MASQUERADE"
    h.cmds.ip6tables_missing = False
    h.round()
    assert h.postrouting6("fd65::5", "2001:db8::7") == "MASQUERADE"


def test_missing_ipset_binary_is_a_clear_error() -> None:
    class NoIpset(FakeCommands):
        def run(self, argv, **kw):  # type: ignore[no-untyped-def]
            if argv[0] == "ipset":
                raise CommandError(argv, 127, "ipset: not found", None)
            return super().run(argv, **kw)

    mgr = NatOutgoingManager(runner=NoIpset())
    mgr.on_update(_pool("10.65.0.0/16", True))
    with pytest.raises(Exception, match="ipset"):
        mgr.apply()


# --- floating IPs ------------------------------------------------------------------------------

def _wep(name: str, ip: str, *fips: str, ip6: str = "", fips6: tuple[str, ...] = ()
         ) -> object:
    from pyfelix.agent.proto import (
        NatInfo,
        WorkloadEndpoint,
        WorkloadEndpointID,
        WorkloadEndpointUpdate,
    )

    return WorkloadEndpointUpdate(
        id=WorkloadEndpointID(orchestrator="k8s", workload=f"x/{name}", endpoint="eth0"),
        endpoint=WorkloadEndpoint(state="active", name=f"cali{name}", ipv4_nets=(f"{ip}/32",),
                                  ipv6_nets=(f"{ip6}/128",) if ip6 else (),
                                  ipv4_nat=tuple(NatInfo(f, ip) for f in fips),
                                  ipv6_nat=tuple(NatInfo(f, ip6) for f in fips6)))


def _fip_harness(enabled: bool) -> NatHarness:
    return NatHarness(floating_ips=enabled)


def test_floating_ips_dnat_in_prerouting_and_output_snat_for_hairpin() -> None:
    h = _fip_harness(True)
    h.sync(_pool("10.65.0.0/16", False), _wep("a", "10.65.0.1", "10.65.200.1"),
           _wep("b", "10.65.0.2"))
    nat = h.cmds.iptables.tables["nat"]
    assert _rules(nat["cali-fip-dnat"]) == [
        "-d 10.65.200.1/32 -j DNAT --to-destination 10.65.0.1"]
    assert _rules(nat["cali-fip-snat"]) == [
        "-s 10.65.0.1/32 -d 10.65.0.1/32 -j SNAT --to-source 10.65.200.1"]
    assert any("cali-fip-dnat" in r for r in _rules(nat["cali-PREROUTING"]))
    assert any("cali-fip-dnat" in r for r in _rules(nat["cali-OUTPUT"]))
    assert any("cali-PREROUTING" in r for r in _rules(nat["PREROUTING"]))
    # the endpoint goes: the chains and our inserts go with the last floating IP
    from pyfelix.agent.proto import WorkloadEndpointRemove

    h.mgr.on_update(WorkloadEndpointRemove(id=_wep("a", "10.65.0.1").id))  # type: ignore
    h.round()
    nat = h.cmds.iptables.tables["nat"]
    assert "cali-fip-dnat" not in nat and "cali-PREROUTING" not in nat
    assert not any("cali-" in r for r in _rules(nat.get("PREROUTING", [])))
    assert h.postrouting("10.65.0.5", "8.8.8.8") == "ACCEPT"  # NAT outgoing unaffected


def test_floating_ips_disabled_program_nothing() -> None:
    h = _fip_harness(False)
    h.sync(_pool("10.65.0.0/16", False),
           _wep("a", "10.65.0.1", "10.65.200.1", ip6="fd65::1", fips6=("fd65::c8:1",)))
    for nat in (h.cmds.iptables.tables["nat"], h.cmds.iptables6.tables["nat"]):
        assert "cali-fip-dnat" not in nat and "cali-fip-snat" not in nat


def test_ipv6_floating_ips_dnat_in_ip6tables_only() -> None:
    h = _fip_harness(True)
    h.sync(_pool("fd65::/64", False),
           _wep("a", "10.65.0.1", "10.65.200.1", ip6="fd65::1", fips6=("fd65::c8:1",)),
           _wep("b", "10.65.0.2", ip6="fd65::2"))
    nat4, nat6 = h.cmds.iptables.tables["nat"], h.cmds.iptables6.tables["nat"]
    assert _rules(nat4["cali-fip-dnat"]) == [
        "-d 10.65.200.1/32 -j DNAT --to-destination 10.65.0.1"]
    assert _rules(nat6["cali-fip-dnat"]) == [
        "-d fd65::c8:1/128 -j DNAT --to-destination fd65::1"]
    assert _rules(nat6["cali-fip-snat"]) == [
        "-s fd65::1/128 -d fd65::1/128 -j SNAT --to-source fd65::c8:1"]
    for base, ours in (("PREROUTING", "cali-PREROUTING"), ("OUTPUT", "cali-OUTPUT"),
                       ("POSTROUTING", "cali-POSTROUTING")):
        assert [r for r in _rules(nat6[base]) if "cali-" in r] == [f"-j {ours}"]
    assert _rules(nat6["cali-POSTROUTING"]) == ["-j cali-fip-snat", "-j cali-nat-outgoing"]
    # only the IPv6 floating IP goes: IPv4 keeps its own, IPv6 loses chains and inserts
    h.mgr.on_update(_wep("a", "10.65.0.1", "10.65.200.1", ip6="fd65::1"))
    h.round()
    nat4, nat6 = h.cmds.iptables.tables["nat"], h.cmds.iptables6.tables["nat"]
    assert "cali-fip-dnat" in nat4
    assert "cali-fip-dnat" not in nat6 and "cali-PREROUTING" not in nat6
    assert not any("cali-" in r for r in _rules(nat6.get("PREROUTING", [])))
    assert _rules(nat6["cali-POSTROUTING"]) == ["-j cali-nat-outgoing"]


@pytest.mark.parametrize("version", [4, 6])
def test_nat_chains_render_each_family_with_its_sets_and_host_prefix(version: int) -> None:
    from pyfelix.agent.dataplane.managers.nat import nat_chains
    from pyfelix.agent.proto import NatInfo

    fips = [NatInfo("10.65.200.1", "10.65.0.1"), NatInfo("fd65::c8:1", "fd65::1")]
    chains = {c.name: c.rules for c in nat_chains(True, fips, version=version)}
    ext, internal, host = (("10.65.200.1", "10.65.0.1", 32) if version == 4
                           else ("fd65::c8:1", "fd65::1", 128))
    sets = "cali40" if version == 4 else "cali60"
    assert chains == {
        "cali-PREROUTING": ("-j cali-fip-dnat",),
        "cali-OUTPUT": ("-j cali-fip-dnat",),
        "cali-fip-dnat": (f"-d {ext}/{host} -j DNAT --to-destination {internal}",),
        "cali-POSTROUTING": ("-j cali-fip-snat", "-j cali-nat-outgoing"),
        "cali-fip-snat": (f"-s {internal}/{host} -d {internal}/{host} -j SNAT "
                          f"--to-source {ext}",),
        "cali-nat-outgoing": (f"-m set --match-set {sets}masq-ipam-pools src -m set ! "
                              f"--match-set {sets}all-ipam-pools dst -j MASQUERADE",),
    }
    assert {c.name: c.rules for c in nat_chains(False, version=version)} == {
        "cali-POSTROUTING": ("-j cali-nat-outgoing",), "cali-nat-outgoing": ()}


def _rules(chain: object) -> list[str]:
    return [_strip_comment(str(r)) for r in chain]  # type: ignore[attr-defined]


def _strip_comment(rule: str) -> str:
    import re

    return re.sub(r"\s*-m comment --comment \S+", "", rule).replace("'!'", "!").strip()
