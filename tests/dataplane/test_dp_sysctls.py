"""SysctlManager on FakeSysctls: globals and per-interface knobs, diff-only writes, drift;
rp_filter off where an endpoint allows spoofed IPv4 sources (iptables mode)."""

from __future__ import annotations

import pytest

from pyfelix.agent.dataplane.events import InterfaceUpdate
from pyfelix.agent.dataplane.managers.sysctls import SysctlError, SysctlManager
from pyfelix.agent.proto import (
    WorkloadEndpoint,
    WorkloadEndpointID,
    WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
)
from tests.fakes.sysctl import FakeSysctls


def _up(name: str, index: int = 5) -> InterfaceUpdate:
    return InterfaceUpdate(name, index, "up")


def test_globals_and_workload_interface_values() -> None:
    fake = FakeSysctls()
    fake.add_interface("cali1")
    fake.add_interface("eth0")
    m = SysctlManager(sysctls=fake)
    m.on_update(_up("cali1"))
    m.on_update(_up("eth0"))  # not a workload interface: untouched
    m.apply()
    v = fake.values
    assert v["net/ipv4/ip_forward"] == "1"
    assert v["net/ipv4/conf/default/rp_filter"] == "1"
    assert v["net/ipv4/conf/cali1/rp_filter"] == "1"
    assert v["net/ipv4/conf/cali1/proxy_arp"] == "1"
    assert v["net/ipv4/neigh/cali1/proxy_delay"] == "0"
    assert v["net/ipv4/conf/cali1/forwarding"] == "1"
    assert v["net/ipv4/conf/cali1/route_localnet"] == "1"
    assert v["net/ipv6/conf/cali1/accept_ra"] == "0"
    assert v["net/ipv6/conf/cali1/forwarding"] == "1"
    assert v["net/ipv4/conf/eth0/proxy_arp"] == "0"
    assert v["net/ipv6/conf/eth0/accept_ra"] == "1"


def test_bpf_mode_sets_loose_rp_filter_off() -> None:
    fake = FakeSysctls()
    fake.add_interface("cali1")
    m = SysctlManager(sysctls=fake, bpf_mode=True)
    m.on_update(_up("cali1"))
    m.apply()
    assert fake.values["net/ipv4/conf/cali1/rp_filter"] == "0"


def test_second_apply_and_resync_without_drift_write_nothing() -> None:
    fake = FakeSysctls()
    fake.add_interface("cali1")
    m = SysctlManager(sysctls=fake)
    m.on_update(_up("cali1"))
    m.apply()
    n = len(fake.writes)
    m.apply()
    m.request_resync()
    m.apply()
    assert len(fake.writes) == n


def test_values_already_right_are_not_rewritten() -> None:
    fake = FakeSysctls()
    fake.values["net/ipv4/ip_forward"] = "1"
    m = SysctlManager(sysctls=fake)
    m.apply()
    assert ("net/ipv4/ip_forward", "1") not in fake.writes


def test_drift_repaired_on_resync() -> None:
    fake = FakeSysctls()
    fake.add_interface("cali1")
    m = SysctlManager(sysctls=fake)
    m.on_update(_up("cali1"))
    m.apply()
    fake.values["net/ipv4/conf/cali1/proxy_arp"] = "0"
    m.apply()
    assert fake.values["net/ipv4/conf/cali1/proxy_arp"] == "0"
    m.request_resync()
    m.apply()
    assert fake.values["net/ipv4/conf/cali1/proxy_arp"] == "1"


def test_interface_without_ipv6_gets_only_ipv4_knobs() -> None:
    fake = FakeSysctls(ipv6=False)
    fake.add_interface("cali1")
    m = SysctlManager(sysctls=fake)
    m.on_update(_up("cali1"))
    m.apply()
    assert fake.values["net/ipv4/conf/cali1/proxy_arp"] == "1"
    assert not any(p.startswith("net/ipv6/conf/cali1") for p in m.desired())


def test_interface_gone_is_forgotten_and_recreated_is_reconfigured() -> None:
    fake = FakeSysctls()
    fake.add_interface("cali1")
    m = SysctlManager(sysctls=fake)
    m.on_update(_up("cali1"))
    m.apply()
    fake.remove_interface("cali1")
    m.on_update(InterfaceUpdate("cali1", 5, "absent"))
    m.apply()
    assert not any("cali1" in p for p in m.desired())
    fake.add_interface("cali1")
    m.on_update(InterfaceUpdate("cali1", 9, "up"))
    m.apply()
    assert fake.values["net/ipv4/conf/cali1/proxy_arp"] == "1"


def test_vanished_interface_is_not_an_error() -> None:
    fake = FakeSysctls()
    m = SysctlManager(sysctls=fake)
    m.on_update(_up("cali1"))  # reported, but already gone from /proc/sys
    m.apply()
    assert "net/ipv4/conf/cali1/proxy_arp" not in fake.values


def test_write_failure_is_raised_and_retried() -> None:
    fake = FakeSysctls()
    fake.add_interface("cali1")
    m = SysctlManager(sysctls=fake)
    m.on_update(_up("cali1"))
    fake.fail_next(2)
    with pytest.raises(SysctlError, match="2 sysctl write"):
        m.apply()
    m.apply()
    assert fake.values["net/ipv4/ip_forward"] == "1"
    assert fake.values["net/ipv4/conf/cali1/route_localnet"] == "1"


def test_invalid_prefix_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="interface_prefixes"):
        SysctlManager(sysctls=FakeSysctls(), interface_prefixes=("",))


# --- rp_filter and allowSpoofedSourcePrefixes (iptables mode) -----------------------------------

RPF = "net/ipv4/conf/{}/rp_filter"


def _wep(iface: str, *spoof: str, ep: str = "pod1") -> WorkloadEndpointUpdate:
    return WorkloadEndpointUpdate(
        WorkloadEndpointID("k8s", f"ns/{ep}", "eth0"),
        WorkloadEndpoint(state="active", name=iface, ipv4_nets=("10.65.0.1/32",),
                         allow_spoofed_source_prefixes=tuple(spoof)))


def _remove(ep: str = "pod1") -> WorkloadEndpointRemove:
    return WorkloadEndpointRemove(WorkloadEndpointID("k8s", f"ns/{ep}", "eth0"))


@pytest.mark.parametrize("endpoint_first", [True, False])
def test_ipv4_spoofed_prefixes_turn_strict_rpf_off_on_that_interface_only(
        endpoint_first: bool) -> None:
    fake = FakeSysctls()
    for iface in ("cali1", "cali2"):
        fake.add_interface(iface)
    m = SysctlManager(sysctls=fake)
    msgs = [_wep("cali1", "203.0.113.0/24"), _up("cali1")]
    for msg in (msgs if endpoint_first else msgs[::-1]):
        m.on_update(msg)
    m.on_update(_wep("cali2", ep="pod2"))
    m.on_update(_up("cali2"))
    m.apply()
    assert fake.values[RPF.format("cali1")] == "0"
    assert fake.values[RPF.format("cali2")] == "1"
    assert fake.values["net/ipv4/conf/default/rp_filter"] == "1"
    n = len(fake.writes)
    m.request_resync()
    m.apply()
    assert len(fake.writes) == n  # stable


def test_rpf_follows_the_endpoint_prefixes_and_its_removal() -> None:
    fake = FakeSysctls()
    fake.add_interface("cali1")
    m = SysctlManager(sysctls=fake)
    m.on_update(_up("cali1"))
    m.on_update(_wep("cali1"))
    m.apply()
    assert fake.values[RPF.format("cali1")] == "1"
    m.on_update(_wep("cali1", "2001:db8::/64"))  # IPv6 only: IPv4 rp_filter unaffected
    m.apply()
    assert fake.values[RPF.format("cali1")] == "1"
    m.on_update(_wep("cali1", "2001:db8::/64", "198.51.100.7/32"))
    m.apply()
    assert fake.values[RPF.format("cali1")] == "0"
    writes = len(fake.writes)
    m.on_update(_wep("cali1", "198.51.100.0/24"))  # still some IPv4: nothing to write
    m.apply()
    assert len(fake.writes) == writes
    m.on_update(_remove())
    m.apply()
    assert fake.values[RPF.format("cali1")] == "1"
    m.on_update(_wep("cali1", "198.51.100.0/24"))
    m.apply()
    m.on_update(_wep("cali1"))  # prefixes withdrawn
    m.apply()
    assert fake.values[RPF.format("cali1")] == "1"


def test_endpoint_moving_interface_moves_the_loose_rpf() -> None:
    fake = FakeSysctls()
    for iface in ("cali1", "cali2"):
        fake.add_interface(iface)
    m = SysctlManager(sysctls=fake)
    m.on_update(_up("cali1"))
    m.on_update(_up("cali2"))
    m.on_update(_wep("cali1", "203.0.113.0/24"))
    m.apply()
    m.on_update(_wep("cali2", "203.0.113.0/24"))
    m.apply()
    assert fake.values[RPF.format("cali1")] == "1"
    assert fake.values[RPF.format("cali2")] == "0"


def test_endpoint_without_its_interface_writes_nothing_for_it() -> None:
    fake = FakeSysctls()
    m = SysctlManager(sysctls=fake)
    m.on_update(_wep("cali1", "203.0.113.0/24"))
    m.on_update(_wep("eth0", "203.0.113.0/24", ep="odd"))  # not a workload interface
    m.apply()
    assert not any("cali1" in p or "eth0" in p for p in m.desired())
    assert not any("cali1" in p or "eth0" in p for p, _ in fake.writes)


def test_bpf_mode_ignores_endpoints_rp_filter_stays_off() -> None:
    fake = FakeSysctls()
    fake.add_interface("cali1")
    m = SysctlManager(sysctls=fake, bpf_mode=True)
    m.on_update(_up("cali1"))
    m.on_update(_wep("cali1"))
    m.apply()
    assert fake.values[RPF.format("cali1")] == "0"
    m.on_update(_wep("cali1", "203.0.113.0/24"))
    m.on_update(_remove())
    m.apply()
    assert fake.values[RPF.format("cali1")] == "0"


def test_interface_stays_loose_while_any_of_its_endpoints_allows_spoofing() -> None:
    fake = FakeSysctls()
    fake.add_interface("cali1")
    m = SysctlManager(sysctls=fake)
    m.on_update(_up("cali1"))
    m.on_update(_wep("cali1", "203.0.113.0/24", ep="pod1"))
    m.on_update(_wep("cali1", "198.51.100.0/24", ep="pod2"))  # two claim it (a conflict)
    m.apply()
    m.on_update(_remove("pod1"))
    m.apply()
    assert fake.values[RPF.format("cali1")] == "0"
    m.on_update(_remove("pod2"))
    m.apply()
    assert fake.values[RPF.format("cali1")] == "1"
