"""Shared pieces of the BPF node tests: a namespace with veths standing in for a node, a
worker thread inside it, a pin directory of the test's own (both removed afterwards), the
small-maps agent configuration they build with, and allow-all workload endpoints."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterable, Iterator

from pyfelix.agent import proto as p
from pyfelix.agent.bpf.scratch import scratch_pin_dir
from pyfelix.agent.bpf.testrun import NetnsThread
from pyfelix.agent.config import Config, load_config


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


class Node:
    """A test namespace and a thread running inside it."""

    def __init__(self, name: str, thread: NetnsThread) -> None:
        self.name = name
        self.thread = thread

    def filters(self, iface: str, hook: str) -> str:
        return sh("ip", "netns", "exec", self.name, "tc", "filter", "show", "dev", iface, hook)

    def link(self, iface: str) -> str:
        return sh("ip", "-n", self.name, "-o", "link", "show", iface)

    def ifindex(self, iface: str) -> int:
        return int(self.link(iface).split(":")[0])


@contextlib.contextmanager
def node_namespace(name: str, veths: Iterable[tuple[str, str]], *,
                   up: bool = False) -> Iterator[Node]:
    """Namespace `name` with lo up and one veth pair per (interface, peer); `up` also sets
    each interface up. Deleted on the way out, whatever happened."""
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")
        for iface, peer in veths:
            sh("ip", "-n", name, "link", "add", iface, "type", "veth", "peer", "name", peer)
            if up:
                sh("ip", "-n", name, "link", "set", iface, "up")
        with NetnsThread(f"/run/netns/{name}") as thread:
            yield Node(name, thread)
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=60)


@contextlib.contextmanager
def own_pin_dir(tag: str) -> Iterator[str]:
    """A pin directory under /sys/fs/bpf for this test, removed afterwards (and by the next
    scratch pin dir's sweep if this process is killed: agent.bpf.scratch)."""
    with scratch_pin_dir(f"test-{tag}") as path:
        yield path


def small_maps_config(pin_dir: str, **extra: str) -> Config:
    """The agent's configuration with BPFPinDir = pin_dir and small maps (plus `extra`).
    Connect-time load balancing is off: its default (TCP) would attach the cgroup programs
    at the machine's root cgroup, outside anything a test owns (a test that exercises it
    gives the agent a cgroup of its own: tests/privileged/lab/test_lab_ctlb.py)."""
    return load_config(environ={
        "FELIX_BPFCONNECTTIMELOADBALANCING": "Disabled", "FELIX_BPFPINDIR": pin_dir,
        "FELIX_BPFMAPSIZEIPSETS": "64",
        "FELIX_BPFMAPSIZERULES": "4096", "FELIX_BPFMAPSIZECONNTRACK": "4096",
        "FELIX_BPFMAPSIZEENDPOINTS": "64", "FELIX_BPFMAPSIZEROUTES": "1024", **extra})


def allow_all_workloads(ifaces: Iterable[str]) -> list[object]:
    """A `kns.default` allow-all profile and one active workload endpoint per interface."""
    profile = p.ActiveProfileUpdate("kns.default", p.Profile(
        inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),)))
    return [profile, *(p.WorkloadEndpointUpdate(
        p.WorkloadEndpointID("k8s", f"default/{iface}", "eth0"),
        p.WorkloadEndpoint("active", iface, profile_ids=("kns.default",))) for iface in ifaces)]
