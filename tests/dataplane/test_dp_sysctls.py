"""SysctlManager on FakeSysctls: globals and per-interface knobs, diff-only writes, drift."""

from __future__ import annotations

import pytest

from agent.dataplane.events import InterfaceUpdate
from agent.dataplane.managers.sysctls import SysctlError, SysctlManager
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
