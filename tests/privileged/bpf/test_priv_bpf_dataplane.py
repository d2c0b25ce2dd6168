"""The BPF managers on a real kernel, in a namespace of our own: build_bpf_managers compiles
and pins, the policy manager writes the real maps (and nothing on a repeat), the attach
manager puts our programs on workload veths (and a restarted build replaces them), a new
interface gets programs through the real loop + interface monitor (latency printed), a full
LPM trie is a counted error that leaves other endpoints programmed, and the CLI dumps it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from pyfelix.agent import proto as p
from pyfelix.agent.bpf.maps import BY_NAME
from pyfelix.agent.bpf.maps.base import BpfMap
from pyfelix.agent.dataplane.bpf_dataplane import build_bpf_managers
from pyfelix.agent.dataplane.loop import DataplaneLoop
from tests.privileged.bpf.node_testlib import (
    Node,
    allow_all_workloads,
    node_namespace,
    own_pin_dir,
    sh,
    small_maps_config,
)

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
WORKLOADS = ("cali1", "cali2")


@pytest.fixture(scope="module")
def node(root_untouched: None) -> Iterator[Node]:
    veths = [(iface, f"{iface}p") for iface in (*WORKLOADS, "eth0")]
    with node_namespace(f"pyfbpf-dp-{os.getpid()}", veths) as made:
        yield made


@pytest.fixture(scope="module")
def pin_dir(root_untouched: None) -> Iterator[str]:
    with own_pin_dir("dp") as path:
        yield path


def felix_config(pin_dir: str):
    return small_maps_config(pin_dir, FELIX_BPFCONNTRACKCLEANUPINTERVAL="1")


def messages(extra: tuple[object, ...] = ()) -> list[object]:
    profile, *endpoints = allow_all_workloads(WORKLOADS)
    return [profile, *extra, *endpoints, p.InSync()]


def run_round(node: Node, managers: list, msgs: list[object]) -> None:
    def round_() -> None:
        for msg in msgs:
            for m in managers:
                m.on_update(msg)
        for m in managers:
            m.apply()
        for m in managers:
            m.finish_apply()

    node.thread.call(round_)


def writes() -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "pyfelix_bpf_map_writes":
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


def dump(pin_dir: str, map_name: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "pyfelix.cli.main", "bpf", map_name, "dump", "-o",
                           "json", "--pin-dir", pin_dir], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def close_all(node: Node, managers: list) -> None:
    node.thread.call(lambda: [m.close() for m in managers])


@pytest.fixture(scope="module")
def first_build(node: Node, pin_dir: str) -> Iterator[list]:
    managers = node.thread.call(build_bpf_managers, felix_config(pin_dir))
    try:
        run_round(node, managers, messages())
        yield managers
    finally:
        close_all(node, managers)


def test_programs_attached_and_maps_written(node: Node, pin_dir: str, first_build: list):
    for iface in WORKLOADS:
        assert "pyfelix:calico_from_wep:" in node.filters(iface, "ingress")
        assert "pyfelix:calico_to_wep:" in node.filters(iface, "egress")
    assert "bpf" not in node.filters("eth0", "ingress")  # host interface untouched
    rows = dump(pin_dir, "endpoints")
    assert sorted(r["ifindex"] for r in rows) == sorted(node.ifindex(i) for i in WORKLOADS)
    names = {r["name"] for r in dump(pin_dir, "ids")}
    assert "k8s/default/cali1/eth0" in names
    before = writes()
    run_round(node, first_build, messages())  # same state again
    first_build[0].request_resync()
    run_round(node, first_build, [])
    assert writes() == before


def test_full_trie_is_counted_and_other_endpoints_stay_programmed(
        node: Node, pin_dir: str, first_build: list):
    before = REGISTRY.get_sample_value("pyfelix_bpf_map_full_errors_total",
                                       {"map": "ipsets"}) or 0.0
    big = p.IPSetUpdate("s-big", "net", frozenset(f"10.1.{i // 256}.{i % 256}/32"
                                                   for i in range(100)))
    policy = p.ActivePolicyUpdate(p.PolicyID("default", "uses-big"), p.Policy(
        inbound_rules=(p.Rule("allow", src_ip_set_ids=("s-big",)),)))
    ep = p.WorkloadEndpointUpdate(
        p.WorkloadEndpointID("k8s", "default/cali2", "eth0"),
        p.WorkloadEndpoint("active", "cali2", profile_ids=("kns.default",),
                           tiers=(p.TierInfo("default", ingress_policies=("uses-big",)),)))
    run_round(node, first_build, [big, policy, ep])
    assert REGISTRY.get_sample_value("pyfelix_bpf_map_full_errors_total",
                                     {"map": "ipsets"}) == before + 1
    assert first_build[0].unavailable_ipsets == {"s-big"}
    rows = {r["ifindex"]: r for r in dump(pin_dir, "endpoints")}
    assert rows[node.ifindex("cali2")]["ingress"]["len"] == 1  # DENY only: fail closed
    assert rows[node.ifindex("cali1")]["ingress"]["len"] == 2  # unaffected
    run_round(node, first_build, [p.IPSetRemove("s-big"), p.ActivePolicyRemove(
        p.PolicyID("default", "uses-big")), *messages()])
    assert first_build[0].unavailable_ipsets == frozenset()


def test_xdp_follows_host_endpoints_with_untracked_policy(node: Node, first_build: list):
    hep = p.HostEndpointID("node1-eth0")
    policy = p.ActivePolicyUpdate(p.PolicyID("default", "untracked-deny"), p.Policy(
        untracked=True, inbound_rules=(p.Rule("deny", src_nets=("192.0.2.0/24",)),)))
    update = p.HostEndpointUpdate(hep, p.HostEndpoint("eth0", untracked_tiers=(
        p.TierInfo("default", ingress_policies=("untracked-deny",)),)))
    run_round(node, first_build, [policy, update])
    link = sh("ip", "-n", node.name, "link", "show", "eth0")
    # native XDP: veth has the driver hook (GenericXDPEnabled is off, Felix's default)
    assert " xdp " in link and "xdpgeneric" not in link and "prog/xdp id" in link
    assert "xdp" not in sh("ip", "-n", node.name, "link", "show", "cali1")
    # a bridge device has no native XDP: with generic not allowed it gets none (iptables'
    # raw chains enforce the untracked policy there)
    sh("ip", "-n", node.name, "link", "add", "eth9", "type", "bridge")
    try:
        sh("ip", "-n", node.name, "link", "set", "eth9", "up")
        hep9 = p.HostEndpointID("node1-eth9")
        run_round(node, first_build, [p.HostEndpointUpdate(hep9, p.HostEndpoint(
            "eth9", untracked_tiers=(p.TierInfo("default", ingress_policies=(
                "untracked-deny",)),)))])
        assert "xdp" not in sh("ip", "-n", node.name, "link", "show", "eth9")
        run_round(node, first_build, [p.HostEndpointRemove(hep9)])
    finally:
        sh("ip", "-n", node.name, "link", "del", "eth9")
    run_round(node, first_build, [p.HostEndpointRemove(hep)])
    assert "xdp" not in sh("ip", "-n", node.name, "link", "show", "eth0")


def test_generic_xdp_where_the_driver_has_no_native_hook(node: Node) -> None:
    """GenericXDPEnabled: a build with it puts calico_xdp in generic mode on a bridge device
    (a bridge: no native XDP) and native on a veth. Its own pin directory and an interface prefix no
    workload has, so the module's first build keeps its programs."""
    from pyfelix.agent.dataplane.managers.bpf_attach import BpfAttachManager

    with own_pin_dir("dp-generic") as generic_pins:
        _generic_xdp(node, small_maps_config(generic_pins, FELIX_GENERICXDPENABLED="true",
                                             FELIX_INTERFACEPREFIX="zzq"), BpfAttachManager)


def _generic_xdp(node: Node, config, attach_type) -> None:
    managers = node.thread.call(build_bpf_managers, config)
    attach = next(m for m in managers if isinstance(m, attach_type))
    assert attach is not None
    policy = p.ActivePolicyUpdate(p.PolicyID("default", "untracked-deny"), p.Policy(
        untracked=True, inbound_rules=(p.Rule("deny", src_nets=("192.0.2.0/24",)),)))
    tiers = (p.TierInfo("default", ingress_policies=("untracked-deny",)),)
    sh("ip", "-n", node.name, "link", "add", "eth8", "type", "bridge")
    try:
        sh("ip", "-n", node.name, "link", "set", "eth8", "up")
        heps = [p.HostEndpointUpdate(p.HostEndpointID(f"node1-{name}"),
                                     p.HostEndpoint(name, untracked_tiers=tiers))
                for name in ("eth8", "eth0")]
        run_round(node, managers, [policy, *heps, p.InSync()])
        bridge = sh("ip", "-n", node.name, "link", "show", "eth8")
        veth = sh("ip", "-n", node.name, "link", "show", "eth0")
        assert "xdpgeneric" in bridge and "prog/xdp id" in bridge
        assert " xdp " in veth and "xdpgeneric" not in veth
        run_round(node, managers, [p.HostEndpointRemove(h.id) for h in heps])
        assert "xdp" not in sh("ip", "-n", node.name, "link", "show", "eth8")
        assert "xdp" not in sh("ip", "-n", node.name, "link", "show", "eth0")
    finally:
        sh("ip", "-n", node.name, "link", "del", "eth8")
        close_all(node, managers)


def test_new_interface_gets_programs_through_loop_and_monitor(node: Node, first_build: list):
    from pyfelix.agent.dataplane.ifacemonitor import InterfaceMonitor

    def start() -> tuple[DataplaneLoop, InterfaceMonitor]:
        loop = DataplaneLoop(first_build, resync_interval=60)
        monitor = InterfaceMonitor(loop.enqueue, resync_interval=60, poll_interval=0.05)
        loop.enqueue(p.InSync())
        loop.start()
        monitor.start()
        return loop, monitor

    loop, monitor = node.thread.call(start)
    try:
        time.sleep(0.5)
        started = time.monotonic()
        sh("ip", "-n", node.name, "link", "add", "cali9", "type", "veth", "peer", "name",
           "cali9p")
        elapsed = None
        while time.monotonic() - started < 10:
            if "pyfelix:calico_to_wep" in node.filters("cali9", "egress") and \
                    "pyfelix:calico_from_wep" in node.filters("cali9", "ingress"):
                elapsed = time.monotonic() - started
                break
            time.sleep(0.01)
        assert elapsed is not None, "programs not attached to the new interface"
        print(f"\nattach latency (link add -> both filters visible): {elapsed * 1000:.0f} ms")
    finally:
        node.thread.call(lambda: (monitor.stop(), loop.stop()))
        sh("ip", "-n", node.name, "link", "del", "cali9")


def test_restarted_build_adopts_maps_and_replaces_programs(node: Node, pin_dir: str,
                                                           first_build: list):
    old_filter = node.filters("cali1", "ingress")
    ids_before = dump(pin_dir, "ids")
    endpoints_before = dump(pin_dir, "endpoints")
    close_all(node, first_build)  # the first agent goes away (maps and programs stay)
    assert "pyfelix:calico_from_wep:" in node.filters("cali1", "ingress")
    managers = node.thread.call(build_bpf_managers, felix_config(pin_dir))
    try:
        before = writes()
        run_round(node, managers, messages())
        assert writes() == before  # adopted: nothing in the data maps changes
        assert dump(pin_dir, "ids") == ids_before
        assert dump(pin_dir, "endpoints") == endpoints_before
        new_filter = node.filters("cali1", "ingress")
        assert "pyfelix:calico_from_wep:" in new_filter and new_filter != old_filter
        with BpfMap.open_pinned(BY_NAME["conntrack"], pin_dir):
            pass  # still pinned
    finally:
        close_all(node, managers)
