"""Issue 26's first acceptance line: two-node lab scenarios over VXLAN and over IPIP pass on
both dataplanes, with policy enforced across nodes.

Each scenario's pool has an encapsulation mode; the lab then waits for the routes the agent
programs for that mode (not for BGP routes, which confd keeps out of the kernel for such
pools). After the probes the test checks that the cross-node path really was the tunnel:
every node's route to each remote pod goes through the tunnel device with the manager's
protocol, no BIRD route covers it, and the tunnel device carried packets both ways. The
scenarios deny two cross-node flows (wrong port, wrong source), so policy applies to the
inner packets at the workload hooks on both dataplanes; in BPF mode the global counters show
the denials were made by the destination node's programs (the decapsulated packet at the pod's
calico_to_wep), none by the sending node's.

IPIP needs kernel support (CONFIG_NET_IPIP, the `ipip` module); on a kernel without it (checked
by creating an ipip link in a namespace of the test's own) the IPIP cases check that the lab
refuses the scenario at once with that reason, then are reported as skipped. The host's kernel
here has no IPIP: `make vm-overlay` runs this file in a VM on Debian 12's 6.1 kernel, where
a skip counts as a failure.

Loading the ipip module makes the kernel's fallback device tunl0 (down, no address) in every
namespace, the root one included; nothing can prevent that. The module is loaded by the
probe (`ipip_kernel`, module scope) before `root_guard` takes its snapshot, so the guard
still sees any other change, and the test checks that the root namespace's tunl0 stayed as
the kernel made it. The probe's link has endpoints of its own: one without any would clash
with the namespace's tunl0 (EEXIST) and a kernel with IPIP would look like one without.

IP families (issue 18): the scenarios also run under `--ip-family dual` / `ipv6` (lab.family).
A VXLAN pool's IPv6 twin keeps vxlanMode: every IPv6 route to a remote pod must go through
`vxlan-v6.calico` (proto 81, onlink; no BIRD route), that device must carry packets both
ways, and the IPv6 denials are decided on the decapsulated IPv6 packets. An IPIP pool's IPv6
twin is unencapsulated and BGP-routed (Calico has no IPv6 IPIP): its IPv6 routes must be
BIRD's. So `ipip` under `ipv6` has no IPIP pool at all and runs on any kernel. `make test`
(and `make vm-overlay`) run the IPv4 cases and two dual ones: vxlan-bpf-dual, and
ipip-iptables-dual, which needs IPIP for its IPv4 pool: here it checks the refusal and skips
(0.3 s), in the VM it runs (IPv4 over tunl0, IPv6 over BGP). PYFELIX_OVERLAY_IP_FAMILIES (comma-
separated, e.g. `ipv4,ipv6,dual`) runs every overlay x dataplane x family given, as the VM
(`make vm-overlay`) can; `make test-matrix` runs them all under ipv6 and dual
(tests/matrix/test_matrix_overlay.py).

On an emulated CPU (the one-shot VM under QEMU TCG) the BPF agents take minutes to compile
their programs with BCC: PYFELIX_LAB_SYNC_TIMEOUT (seconds, default the lab's 60) is how long
the lab waits for them.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from pyfelix.agent.bpf.loader import resolve_pin_dir
from pyfelix.agent.bpf.maps import dump_pinned
from pyfelix.agent.dataplane.managers.ipip import IPIP_DEVICE, IPIP_ROUTE_PROTOCOL
from pyfelix.agent.dataplane.managers.vxlan import (
    VXLAN_DEVICE,
    VXLAN_DEVICE_V6,
    VXLAN_ROUTE_PROTOCOL,
)
from pyfelix.lab.agents import AgentProcesses, AgentStartError
from pyfelix.lab.family import apply_ip_family
from pyfelix.lab.runner import DEFAULT_SYNC_TIMEOUT_SECONDS, LabRunner
from pyfelix.lab.scenario import load_scenario

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
SCENARIOS = REPO / "tests" / "lab" / "scenarios"
OVERLAYS = {"vxlan": ("two-node-vxlan.yaml", VXLAN_DEVICE, VXLAN_ROUTE_PROTOCOL),
            "ipip": ("two-node-ipip.yaml", IPIP_DEVICE, IPIP_ROUTE_PROTOCOL)}


SYNC_TIMEOUT = float(os.environ.get("PYFELIX_LAB_SYNC_TIMEOUT", DEFAULT_SYNC_TIMEOUT_SECONDS))
EXPECTED = ["allow", "deny", "deny", "allow", "allow"]  # the scenarios' probes, in order
# the IPv6 route to a remote pod, by overlay: (device, protocol); None: any device
IPV6_ROUTING = {"vxlan": (VXLAN_DEVICE_V6, str(VXLAN_ROUTE_PROTOCOL)), "ipip": (None, "bird")}


def _cases() -> list[tuple[str, str, str]]:
    """(overlay, dataplane, ip family): see the module docstring."""
    chosen = [f for f in os.environ.get("PYFELIX_OVERLAY_IP_FAMILIES", "").split(",") if f]
    if chosen:
        return list(itertools.product(sorted(OVERLAYS), ["bpf", "iptables"], chosen))
    return [*itertools.product(sorted(OVERLAYS), ["bpf", "iptables"], ["ipv4"]),
            ("vxlan", "bpf", "dual"), ("ipip", "iptables", "dual")]


def kernel_has_ipip() -> bool:
    netns = f"pfovl-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", netns], check=True, timeout=10)
    try:
        return subprocess.run(["ip", "-n", netns, "link", "add", "pfprobe", "type", "ipip",
                               "local", "192.0.2.1", "remote", "192.0.2.2"],
                              capture_output=True, timeout=10).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=True, timeout=10)


@pytest.fixture(scope="module")
def ipip_kernel() -> bool:
    """Probed once, before any root_guard snapshot (see the module docstring)."""
    return kernel_has_ipip()


def _root_tunl0_untouched() -> None:
    """The root namespace's tunl0, when the kernel made one: still down, without address."""
    done = subprocess.run(["ip", "-j", "addr", "show", "dev", IPIP_DEVICE], capture_output=True,
                          text=True, timeout=10)
    if done.returncode != 0:
        return  # no tunl0 in the root namespace (no IPIP, or fallback devices not made there)
    (link,) = json.loads(done.stdout)
    assert not link.get("addr_info") and "UP" not in link.get("flags", []), link


def _globals(lab: LabRunner, node: str) -> dict[str, int]:
    pin_dir = resolve_pin_dir(lab.bpffs_dir / node, mount=False)
    return {row["counter"]: int(row["value"])
            for row in dump_pinned("global_counters", str(pin_dir))}


def _ip_json(netns: str, *args: str) -> Any:
    done = subprocess.run(["ip", "-n", netns, "-j", *args], capture_output=True, text=True,
                          check=True, timeout=10)
    return json.loads(done.stdout or "[]")


@pytest.mark.parametrize(("overlay", "dataplane", "family"), _cases(),
                         ids=["-".join(c) for c in _cases()])
def test_two_nodes_over_overlay_with_policy(overlay: str, dataplane: str, family: str,
                                            ipip_kernel: bool, root_guard: Any) -> None:
    run_overlay_case(overlay, dataplane, family, ipip_kernel, root_guard)


def run_overlay_case(overlay: str, dataplane: str, family: str, ipip_kernel: bool,
                     root_guard: Any) -> None:
    """One case (also tests/matrix's, for every family): see the module docstring."""
    scenario_file, device, protocol = OVERLAYS[overlay]
    scenario = apply_ip_family(load_scenario(SCENARIOS / scenario_file), family)
    # under ipv6 the IPIP scenario has only its BGP-routed IPv6 twin pool: no IPIP needed
    if overlay == "ipip" and family != "ipv6" and not ipip_kernel:
        # the lab says so at once rather than waiting for routes that cannot come
        with LabRunner(scenario, agents=AgentProcesses(dataplane), dataplane=dataplane,
                       program_routes=False) as lab:
            lab.build()
            with pytest.raises(AgentStartError, match="no IPIP support"):
                lab.start_agents()
        root_guard.check()
        pytest.skip("this kernel has no IPIP support (CONFIG_NET_IPIP): no tunl0; the lab "
                    "refused the scenario with a clear error")
    # beyond IPv4, the agents' flow logs say who decided each denial
    agents = AgentProcesses(dataplane, flow_logs=family != "ipv4")
    with LabRunner(scenario, agents=agents, dataplane=dataplane,
                   program_routes=False, probe_timeout=0.5, sync_timeout=SYNC_TIMEOUT) as lab:
        lab.build()
        lab.start_agents()
        results = lab.run_steps()
        assert not (wrong := [r.to_json() for r in results if r.mismatch]), wrong
        versions = {"ipv4": (4,), "ipv6": (6,), "dual": (4, 6)}[family]
        assert [r.result for r in results] == [e for e in EXPECTED for _ in versions]
        assert [r.probe.family for r in results] == list(versions) * len(EXPECTED)
        if family != "ipv4":
            # every denial, IPv6 ones included, was decided by policy at the destination
            # pod (reporter dst): on the decapsulated packet, not by the tunnel or the sender
            for result in lab.collect_flows():
                if result.result == "deny":
                    flow = result.flow or {}
                    assert (flow.get("action"), flow.get("reporter")) == ("deny", "dst"), \
                        result.to_json()
        for name, node in lab.topology.nodes.items():
            tunnels = set()
            remote = [p for p in lab.topology.pods.values() if p.node.name != name]
            bird = {r["dst"] for v in versions
                    for r in _ip_json(node.netns, f"-{v}", "route", "show", "proto", "bird")}
            for pod in remote:
                for address in pod.spec.addresses:
                    want_dev, want_proto = ((device, str(protocol)) if address.version == 4
                                            else IPV6_ROUTING[overlay])
                    routes = _ip_json(node.netns, f"-{address.version}", "route", "show",
                                      f"{address}/{address.max_prefixlen}")
                    assert routes, f"{name}: no route to {pod.key} {address}"
                    route = routes[0]
                    where = (name, pod.key, str(address), route)
                    assert str(route.get("protocol")) == want_proto, where
                    if want_dev is None:  # BGP-routed: over the underlay, no tunnel
                        assert route.get("dev") not in (device, VXLAN_DEVICE_V6), where
                        continue
                    assert route.get("dev") == want_dev, where
                    assert "onlink" in route.get("flags", []), where
                    assert not any(ipaddress.ip_address(b.split("/")[0]) == address
                                   for b in bird), (where, bird)
                    tunnels.add(want_dev)
            for tunnel in sorted(tunnels):
                stats = _ip_json(node.netns, "-s", "link", "show", tunnel)[0]["stats64"]
                # the probes crossed the tunnel both ways (SYNs out, SYN-ACKs back)
                assert stats["tx"]["packets"] > 0 and stats["rx"]["packets"] > 0, \
                    (name, tunnel, stats)
        if dataplane == "bpf":
            # the two denials per family (node2's pods to a on node1) were decided on the
            # decapsulated packets by a's calico_to_wep on node1; node2's programs denied
            # nothing
            denied = {name: _globals(lab, name)["policy_denied"] for name in lab.topology.nodes}
            assert denied["node1"] >= 2 * len(versions) and denied["node2"] == 0, denied
    root_guard.check()
    _root_tunl0_untouched()
