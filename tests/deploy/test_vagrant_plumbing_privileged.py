"""The Vagrant demo's pod plumbing (vagrant/demo/vmlab.py), run for real in namespaces.

A node VM cannot boot here, so a network namespace of this machine stands in for node1: the
demo's node1 pods are built with vmlab's own commands (`plumbing_commands(pod, node_netns)`),
served with the lab's echo servers and probed with the lab's prober. With no agent running,
the two pods of node1 must reach each other through the host-side routes and proxy ARP the
commands set up, and a pod of node2 must be unreachable (no BGP route without BIRD).

Every namespace is named `pv<6 hex>-...` for this run and removed in `finally`; links and
routes of the root namespace are compared before and after.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest
from deploy_checks import VAGRANT_DIR, load_documents, load_vmlab

from pyfelix.lab.netns import list_netns
from pyfelix.lab.probe import Prober
from pyfelix.lab.scenario import ProbeSpec
from pyfelix.lab.servers import PodServers

vmlab = load_vmlab()

PROBE_TIMEOUT_SECONDS = 2.0


def _root_state() -> tuple[str, str]:
    links = subprocess.run(["ip", "-o", "link", "show"], check=True, capture_output=True,
                           text=True).stdout
    routes = subprocess.run(["ip", "route", "show", "table", "all"], check=True,
                            capture_output=True, text=True).stdout
    names = sorted(line.split(":")[1].strip() for line in links.splitlines())
    return "\n".join(names), routes


@pytest.mark.privileged
def test_node1_demo_pods_reach_each_other_and_not_an_unrouted_node2_pod() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    run_prefix = f"pv{secrets.token_hex(3)}-"
    node_netns = f"{run_prefix}node1"
    pods = vmlab.cluster_pods(load_documents(Path(VAGRANT_DIR / "demo" / "cluster.yaml")),
                              netns_prefix=run_prefix)
    local = vmlab.local_pods(pods, "node1")
    remote = [p for p in pods if p.node != "node1"]
    assert len(local) >= 2 and remote
    before = _root_state()
    created: list[str] = []
    servers = PodServers()
    try:
        created.append(node_netns)
        vmlab.run_command(["ip", "netns", "add", node_netns])
        vmlab.run_command(["ip", "-n", node_netns, "link", "set", "lo", "up"])
        vmlab.run_command(["ip", "netns", "exec", node_netns, "sysctl", "-q", "-w",
                           "net.ipv4.ip_forward=1"])
        for pod in local:
            created.append(pod.netns)
            for argv in vmlab.plumbing_commands(pod, node_netns=node_netns):
                vmlab.run_command(argv)
            for port, protocol in pod.ports:
                servers.add(pod.netns, port, protocol)
        servers.start()

        prober = Prober({p.key: p.netns for p in local}, timeout=PROBE_TIMEOUT_SECONDS)
        same_node = [ProbeSpec(a.key, b.key, b.ip, port, protocol)
                     for a in local for b in local if a != b for port, protocol in b.ports]
        results = prober.run(same_node)
        assert [(r.probe.source, r.probe.target, r.result) for r in results] == [
            (p.source, p.target, "allow") for p in same_node]

        port, protocol = remote[0].ports[0]
        (unrouted,) = prober.run([ProbeSpec(local[0].key, remote[0].key, remote[0].ip, port,
                                            protocol)])
        assert unrouted.result == "deny"
    finally:
        servers.stop()
        for name in reversed(created):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    assert [n for n in list_netns() if n.startswith(run_prefix)] == []
    assert _root_state() == before
