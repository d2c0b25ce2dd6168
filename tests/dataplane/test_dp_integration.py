"""The driver loop with the real managers on fakes: one round programs everything in order,
periodic resync repairs drift, and an iptables that keeps failing makes the loop fail closed."""

from __future__ import annotations

import random

from pyfelix.agent.dataplane.ifacemonitor import InterfaceMonitor
from pyfelix.agent.dataplane.loop import DataplaneLoop
from pyfelix.agent.dataplane.managers.ipsets import IPSetsManager
from pyfelix.agent.dataplane.managers.iptables import IptablesManager
from pyfelix.agent.dataplane.managers.routes import ROUTE_PROTOCOL, RouteManager
from pyfelix.agent.dataplane.managers.sysctls import SysctlManager
from pyfelix.agent.proto import (
    ActivePolicyRemove,
    ActivePolicyUpdate,
    InSync,
    IPSetRemove,
    IPSetUpdate,
    Policy,
    PolicyID,
    Rule,
    TierInfo,
)
from tests.dataplane.dp_harness import endpoint
from tests.fakes.clock import FakeClock
from tests.fakes.commands import FakeCommands
from tests.fakes.netlink import FakeNetlink
from tests.fakes.sysctl import FakeSysctls


class FakeNode:
    def __init__(self, **loop_kw: object) -> None:
        self.clock = FakeClock()
        self.cmds = FakeCommands()
        self.nl = FakeNetlink()
        self.sysctls = FakeSysctls()
        self.loop = DataplaneLoop(
            [IPSetsManager(runner=self.cmds), IptablesManager(runner=self.cmds),
             RouteManager(netlink=self.nl), SysctlManager(sysctls=self.sysctls)],
            clock=self.clock, rng=random.Random(1), **loop_kw)  # type: ignore[arg-type]
        self.monitor = InterfaceMonitor(self.loop.enqueue, netlink=self.nl,
                                        events=self.nl.events(), clock=self.clock)

    def add_workload(self, iface: str) -> None:
        self.nl.add_link(iface)
        self.sysctls.add_interface(iface)

    def step(self) -> bool:
        self.monitor.poll_once(0)
        return self.loop.run_once()


def _policy_msgs() -> list[object]:
    return [
        IPSetUpdate("clients", "net", frozenset({"10.65.0.1/32"})),
        ActivePolicyUpdate(PolicyID("default", "web"), Policy(inbound_rules=(
            Rule(action="allow", protocol=6, src_ip_set_ids=("clients",)),))),
        endpoint("cali1", "10.65.0.1"),
        endpoint("cali2", "10.65.0.2", tiers=[TierInfo("default", ingress_policies=("web",))]),
    ]


def test_one_loop_round_programs_sets_rules_routes_and_sysctls() -> None:
    node = FakeNode()
    node.add_workload("cali1")
    node.add_workload("cali2")
    for msg in [*_policy_msgs(), InSync()]:
        node.loop.enqueue(msg)
    assert node.step() is True and node.loop.in_sync.is_set()
    # one calc-graph set: its IPv4 set and its (empty) IPv6 twin
    assert sorted(n[:7] for n in node.cmds.ipset.sets) == ["cali40s", "cali60s"]
    assert "cali-tw-cali2" in node.cmds.iptables.user_chains()
    assert "cali-tw-cali2" in node.cmds.iptables6.user_chains()
    assert {r.dst for r in node.nl.routes if r.protocol == ROUTE_PROTOCOL} == {
        "10.65.0.1/32", "10.65.0.2/32"}
    assert node.sysctls.values["net/ipv4/conf/cali2/proxy_arp"] == "1"
    # removal in the sequencer's order, one batch: sets destroyed after the rules went
    for msg in [endpoint("cali2", "10.65.0.2"), ActivePolicyRemove(PolicyID("default", "web")),
                IPSetRemove("clients")]:
        node.loop.enqueue(msg)
    assert node.step() is True and node.loop.consecutive_failures == 0
    assert node.cmds.ipset.sets == {}


def test_periodic_resync_repairs_drift_through_the_loop() -> None:
    node = FakeNode(resync_interval=60.0)
    node.add_workload("cali2")
    for msg in [*_policy_msgs(), InSync()]:
        node.loop.enqueue(msg)
    node.step()
    node.cmds.iptables.chains["cali-tw-cali2"] = []
    node.nl.routes.clear()
    node.sysctls.values["net/ipv4/ip_forward"] = "0"
    node.clock.advance(59.0)
    assert node.step() is False
    node.clock.advance(1.0)
    assert node.step() is True
    assert node.cmds.iptables.chains["cali-tw-cali2"] != []
    assert any(r.dst == "10.65.0.2/32" for r in node.nl.routes)
    assert node.sysctls.values["net/ipv4/ip_forward"] == "1"


def test_interface_events_flow_from_monitor_to_routes() -> None:
    node = FakeNode()
    for msg in [*_policy_msgs(), InSync()]:
        node.loop.enqueue(msg)
    node.step()
    assert not node.nl.routes
    node.add_workload("cali2")
    node.step()
    assert {r.dst for r in node.nl.routes} == {"10.65.0.2/32"}
    node.nl.remove_link("cali2")
    node.step()
    assert not node.nl.routes


def test_persistent_iptables_failure_fails_closed() -> None:
    reasons: list[str] = []
    node = FakeNode(fail_closed_after=30.0, retry_max=5.0, on_fatal=reasons.append)
    node.cmds.iptables.fail_next(10**6)
    for msg in [*_policy_msgs(), InSync()]:
        node.loop.enqueue(msg)
    for _ in range(100):
        node.step()
        if node.loop.fatal.is_set():
            break
        node.clock.advance(5.0)
    assert node.loop.fatal.is_set() and "iptables" in reasons[0]
    assert node.clock.monotonic() - 1000.0 >= 30.0
