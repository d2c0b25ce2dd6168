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

On an emulated CPU (the one-shot VM under QEMU TCG) the BPF agents take minutes to compile
their programs with BCC: PYFELIX_LAB_SYNC_TIMEOUT (seconds, default the lab's 60) is how long
the lab waits for them.
"""

from __future__ import annotations

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
from pyfelix.agent.dataplane.managers.vxlan import VXLAN_DEVICE, VXLAN_ROUTE_PROTOCOL
from pyfelix.lab.agents import AgentProcesses, AgentStartError
from pyfelix.lab.runner import DEFAULT_SYNC_TIMEOUT_SECONDS, LabRunner
from pyfelix.lab.scenario import load_scenario

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
SCENARIOS = REPO / "tests" / "lab" / "scenarios"
OVERLAYS = {"vxlan": ("two-node-vxlan.yaml", VXLAN_DEVICE, VXLAN_ROUTE_PROTOCOL),
            "ipip": ("two-node-ipip.yaml", IPIP_DEVICE, IPIP_ROUTE_PROTOCOL)}


SYNC_TIMEOUT = float(os.environ.get("PYFELIX_LAB_SYNC_TIMEOUT", DEFAULT_SYNC_TIMEOUT_SECONDS))


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


@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_two_nodes_over_overlay_with_policy(overlay: str, dataplane: str, ipip_kernel: bool,
                                            root_guard: Any) -> None:
    scenario_file, device, protocol = OVERLAYS[overlay]
    scenario = load_scenario(SCENARIOS / scenario_file)
    if overlay == "ipip" and not ipip_kernel:
        # the lab says so at once rather than waiting for routes that cannot come
        with LabRunner(scenario, agents=AgentProcesses(dataplane), dataplane=dataplane,
                       program_routes=False) as lab:
            lab.build()
            with pytest.raises(AgentStartError, match="no IPIP support"):
                lab.start_agents()
        root_guard.check()
        pytest.skip("this kernel has no IPIP support (CONFIG_NET_IPIP): no tunl0; the lab "
                    "refused the scenario with a clear error")
    with LabRunner(scenario, agents=AgentProcesses(dataplane), dataplane=dataplane,
                   program_routes=False, probe_timeout=0.5, sync_timeout=SYNC_TIMEOUT) as lab:
        lab.build()
        lab.start_agents()
        results = lab.run_steps()
        assert not (wrong := [r.to_json() for r in results if r.mismatch]), wrong
        assert [r.result for r in results] == ["allow", "deny", "deny", "allow", "allow"]
        for name, node in lab.topology.nodes.items():
            remote = [p for p in lab.topology.pods.values() if p.node.name != name]
            bird = {r["dst"] for r in _ip_json(node.netns, "route", "show", "proto", "bird")}
            for pod in remote:
                routes = _ip_json(node.netns, "route", "show", f"{pod.spec.ip}/32")
                assert routes, f"{name}: no route to {pod.key}"
                route = routes[0]
                assert route.get("dev") == device, (name, pod.key, route)
                assert str(route.get("protocol")) == str(protocol), (name, pod.key, route)
                assert "onlink" in route.get("flags", []), (name, pod.key, route)
                assert str(pod.spec.ip) not in bird, (name, pod.key, bird)
            stats = _ip_json(node.netns, "-s", "link", "show", device)[0]["stats64"]
            # the probes crossed the tunnel both ways (SYNs out, SYN-ACKs back)
            assert stats["tx"]["packets"] > 0 and stats["rx"]["packets"] > 0, (name, stats)
        if dataplane == "bpf":
            # the two denials (node2's pods to a on node1) were decided on the decapsulated
            # packets by a's calico_to_wep on node1; node2's programs denied nothing
            denied = {name: _globals(lab, name)["policy_denied"] for name in lab.topology.nodes}
            assert denied["node1"] >= 2 and denied["node2"] == 0, denied
    root_guard.check()
    _root_tunl0_untouched()
