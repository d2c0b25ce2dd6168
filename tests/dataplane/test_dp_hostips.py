"""Host IPs from interface addresses: the `cali40this-host` set, exclusions, drift repair."""

from __future__ import annotations

import pytest

from pyfelix.agent.dataplane.events import InterfaceAddrsUpdate
from pyfelix.agent.dataplane.managers.hostips import (
    HostIPsManager,
    HostIPsTracker,
    InterfaceMatcher,
)
from pyfelix.agent.proto import InSync
from tests.fakes.commands import FakeCommands


def _addrs(name: str, *cidrs: str) -> InterfaceAddrsUpdate:
    return InterfaceAddrsUpdate(name, frozenset(cidrs))


def test_host_ips_leave_out_ipvs_and_workload_interfaces() -> None:
    tracker = HostIPsTracker(workload_prefixes=("cali", "tap"))
    for msg in (_addrs("eth0", "198.18.0.1/15", "fd00::1/64"), _addrs("lo", "127.0.0.1/8"),
                _addrs("kube-ipvs0", "10.96.0.1/32", "10.96.0.10/32"),
                _addrs("cali123", "169.254.1.1/32"), _addrs("tap9", "10.0.0.1/32"),
                _addrs("vxlan.calico", "10.65.255.1/32")):
        tracker.on_addrs(msg)
    assert tracker.host_ips() == {"198.18.0.1", "fd00::1", "127.0.0.1", "10.65.255.1"}
    assert tracker.ipv4_host_ips() == {"198.18.0.1", "127.0.0.1", "10.65.255.1"}
    assert tracker.on_addrs(InterfaceAddrsUpdate("eth0", None))  # changed
    assert not tracker.on_addrs(_addrs("kube-ipvs0", "10.96.0.2/32"))  # excluded: no change
    assert tracker.host_ips() == {"127.0.0.1", "10.65.255.1"}


def test_interface_exclude_names_and_regexes() -> None:
    matcher = InterfaceMatcher.parse("kube-ipvs0, /dummy[0-9]+/")
    assert matcher.matches("kube-ipvs0") and matcher.matches("dummy12")
    assert not matcher.matches("dummy") and not matcher.matches("xdummy1")
    with pytest.raises(ValueError, match="InterfaceExclude"):
        InterfaceMatcher.parse("/[/")


def test_manager_programs_the_set_and_repairs_drift() -> None:
    cmds = FakeCommands()
    mgr = HostIPsManager(runner=cmds)
    for msg in (_addrs("eth0", "198.18.0.1/15"), _addrs("kube-ipvs0", "10.96.0.1/32"),
                InSync()):
        mgr.on_update(msg)
    mgr.apply()
    assert cmds.ipset.members("cali40this-host") == {"198.18.0.1"}
    calls = len(cmds.calls)
    mgr.apply()
    assert len(cmds.calls) == calls  # nothing to do: no command at all
    mgr.on_update(_addrs("eth0", "198.18.0.1/15", "198.18.0.100/15"))
    mgr.apply()
    assert cmds.ipset.members("cali40this-host") == {"198.18.0.1", "198.18.0.100"}
    cmds.ipset.sets["cali40this-host"][1].clear()
    mgr.request_resync()
    mgr.apply()
    assert cmds.ipset.members("cali40this-host") == {"198.18.0.1", "198.18.0.100"}


def test_calc_ipsets_manager_leaves_fixed_name_sets_alone() -> None:
    from pyfelix.agent.dataplane.managers.ipsets import IPSetsManager

    cmds = FakeCommands()
    hostips = HostIPsManager(runner=cmds)
    ipsets = IPSetsManager(runner=cmds)
    for msg in (_addrs("eth0", "198.18.0.1/15"), InSync()):
        hostips.on_update(msg)
        ipsets.on_update(msg)
    hostips.apply()
    ipsets.request_resync()
    ipsets.apply()
    ipsets.finish_apply()  # after in-sync it destroys the calc sets nobody wants - not ours
    assert cmds.ipset.members("cali40this-host") == {"198.18.0.1"}
