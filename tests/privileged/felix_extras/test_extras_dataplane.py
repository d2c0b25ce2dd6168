"""The whole Linux dataplane (`LinuxDataplane`, iptables mode) in a router namespace, with
real traffic to workload namespaces: static ARP and kube-proxy IPVS awareness.

- Static ARP: the workload's eth0 does not answer ARP (`arp off`). Once its endpoint carries
  its MAC, the router holds a PERMANENT neighbour entry and reaches it; when the MAC is
  withdrawn the entry goes and the workload is unreachable again.
- IPVS: a `kube-ipvs0` link carries a service address. It is left out of
  `cali40this-host`; a workload reaches the service address (IPVS would forward it) although
  DefaultEndpointToHostAction is Drop, cannot reach the host's own address, and loses the
  service too when its egress policy denies.
Namespaces are `pyf12-<pid>-<n>`, created and removed here.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from pyfelix.agent.dataplane.linux import LinuxDataplane, LinuxDataplaneConfig
from pyfelix.agent.proto import (
    ActivePolicyUpdate,
    ActiveProfileUpdate,
    InSync,
    Policy,
    PolicyID,
    Profile,
    Rule,
    TierInfo,
    WorkloadEndpoint,
    WorkloadEndpointID,
    WorkloadEndpointUpdate,
)
from pyfelix.agent.shims.netns import NetnsThread

pytestmark = pytest.mark.privileged

_COUNTER = itertools.count()
PREFIX = f"pyf12-{os.getpid()}-"
HOST_IP = "198.18.0.1"
VIP = "10.96.0.10"
WL_IP = "10.65.0.1"
OPEN = ActiveProfileUpdate("open", Profile(inbound_rules=(Rule(action="allow"),),
                                           outbound_rules=(Rule(action="allow"),)))


def sh(ns: str, *argv: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], check=True, capture_output=True,
                          text=True, timeout=30).stdout


@pytest.fixture
def namespaces(root_unchanged: None) -> Iterator[list[str]]:
    created: list[str] = []

    def make() -> str:
        name = f"{PREFIX}{next(_COUNTER)}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        created.append(name)
        sh(name, "ip", "link", "set", "lo", "up")
        return name

    try:
        yield [make(), make()]
    finally:
        for name in reversed(created):
            subprocess.run(["ip", "netns", "del", name], check=False)


def router_with_workload(router: str, wl: str) -> str:
    """An uplink with the host IP, and cali1 <-> the workload's eth0; returns eth0's MAC."""
    sh(router, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1")
    sh(router, "ip", "addr", "add", f"{HOST_IP}/15", "dev", "up0")
    for link in ("up0", "up1"):
        sh(router, "ip", "link", "set", link, "up")
    sh(router, "ip", "route", "add", "default", "dev", "up0")
    sh(router, "ip", "link", "add", "cali1", "type", "veth", "peer", "name", "eth0",
       "netns", f"/run/netns/{wl}")
    sh(router, "ip", "link", "set", "cali1", "up")
    sh(wl, "ip", "addr", "add", f"{WL_IP}/32", "dev", "eth0")
    sh(wl, "ip", "link", "set", "eth0", "up")
    sh(wl, "ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
    sh(wl, "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
    return sh(wl, "cat", "/sys/class/net/eth0/address").strip()


def endpoint(mac: str = "", tiers: tuple[TierInfo, ...] = (),
             profiles: tuple[str, ...] = ("open",)) -> WorkloadEndpointUpdate:
    return WorkloadEndpointUpdate(WorkloadEndpointID("k8s", "ns/wl", "eth0"), WorkloadEndpoint(
        state="active", name="cali1", mac=mac, ipv4_nets=(f"{WL_IP}/32",),
        profile_ids=profiles, tiers=tiers))


class Server:
    def __init__(self, thread: NetnsThread, ip: str, port: int) -> None:
        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((ip, port))
            s.listen(8)
            return s

        self.sock = thread.call(make)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"hello")


def connects(thread: NetnsThread, ip: str, port: int, timeout: float = 0.5) -> bool:
    def attempt() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                s.connect((ip, port))
                return s.recv(5) == b"hello"
            except OSError:
                return False

    return thread.call(attempt)


def eventually(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_static_arp_lets_the_host_reach_a_workload_that_does_not_answer_arp(
        namespaces: list[str]) -> None:
    router, wl = namespaces
    wl_mac = router_with_workload(router, wl)
    sh(wl, "ip", "link", "set", "eth0", "arp", "off")
    cali_mac = sh(router, "cat", "/sys/class/net/cali1/address").strip()
    sh(wl, "ip", "neigh", "add", "169.254.1.1", "lladdr", cali_mac, "dev", "eth0",
       "nud", "permanent")
    dp = LinuxDataplane(netns=router, config=LinuxDataplaneConfig())
    host, workload = NetnsThread(router), NetnsThread(wl)
    server = Server(workload, WL_IP, 8080)
    try:
        dp.start()
        for msg in (OPEN, endpoint(mac=wl_mac.upper()), InSync()):
            dp.enqueue(msg)
        assert dp.in_sync.wait(15)
        assert eventually(lambda: "PERMANENT" in sh(router, "ip", "neigh", "show", WL_IP))
        assert wl_mac in sh(router, "ip", "neigh", "show", WL_IP)
        assert eventually(lambda: connects(host, WL_IP, 8080))
        dp.enqueue(endpoint(mac=""))  # MAC unknown now: the entry goes
        assert eventually(lambda: "PERMANENT" not in sh(router, "ip", "neigh", "show", WL_IP))
        sh(router, "ip", "neigh", "flush", "dev", "cali1")
        assert not connects(host, WL_IP, 8080, timeout=1.0)  # no ARP answer, no entry
    finally:
        dp.stop()
        server.sock.close()
        host.close()
        workload.close()


def test_ipvs_service_address_is_not_host_traffic_and_egress_policy_still_applies(
        namespaces: list[str]) -> None:
    router, wl = namespaces
    router_with_workload(router, wl)
    sh(router, "ip", "link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "kipvs-peer")
    sh(router, "ip", "addr", "add", f"{VIP}/32", "dev", "kube-ipvs0")
    dp = LinuxDataplane(netns=router, config=LinuxDataplaneConfig(
        endpoint_to_host_action="Drop"))
    host, workload = NetnsThread(router), NetnsThread(wl)
    servers = [Server(host, ip, 80) for ip in (VIP, HOST_IP)]
    deny_egress = ActivePolicyUpdate(PolicyID("default", "no-egress"), Policy(
        outbound_rules=(Rule(action="deny"),)))
    try:
        dp.start()
        for msg in (OPEN, deny_egress, endpoint(), InSync()):
            dp.enqueue(msg)
        assert dp.in_sync.wait(15)
        # the interface monitor's first report may follow the first in-sync round
        assert eventually(lambda: "cali40this-host" in sh(router, "ipset", "list", "-n"))
        host_ips = sh(router, "ipset", "list", "cali40this-host")
        assert HOST_IP in host_ips and VIP not in host_ips
        assert eventually(lambda: connects(workload, VIP, 80))  # a service: forwarded by IPVS
        assert not connects(workload, HOST_IP, 80)  # the host itself: Drop
        # the workload's egress policy now denies: the service is out of reach too
        dp.enqueue(endpoint(tiers=(TierInfo("default", egress_policies=("no-egress",)),)))
        assert eventually(lambda: not connects(workload, VIP, 80, timeout=0.3))
        # kube-ipvs0 goes away: its address is just a host address again (Drop)
        dp.enqueue(endpoint())
        sh(router, "ip", "link", "del", "kube-ipvs0")
        sh(router, "ip", "addr", "add", f"{VIP}/32", "dev", "up0")
        assert eventually(lambda: "cali40this-host" in sh(router, "ipset", "list", "-n")
                          and VIP in sh(router, "ipset", "list", "cali40this-host"))
        assert eventually(lambda: not connects(workload, VIP, 80, timeout=0.3))
        assert not dp.fatal.is_set()
    finally:
        dp.stop()
        for server in servers:
            server.sock.close()
        host.close()
        workload.close()


@pytest.mark.parametrize("mode", ["iptables", "bpf"])
@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_host_endpoint_chains_in_all_tables_load_into_the_kernel(namespaces: list[str],
                                                                  backend: str,
                                                                  mode: str) -> None:
    """raw (doNotTrack, CT --notrack), mangle (preDNAT), filter (normal, applyOnForward),
    failsafes, VXLAN source rules: the real iptables accepts them, and applying the same
    state again runs no restore. In BPF mode (host endpoints only) the same, with no
    workload chain in any table although a workload endpoint is known."""
    from pyfelix.agent.dataplane.iptables.restore import BACKENDS
    from pyfelix.agent.dataplane.managers.hostips import HostIPsManager
    from pyfelix.agent.dataplane.managers.iptables import IptablesManager
    from pyfelix.agent.proto import (
        HostEndpoint,
        HostEndpointID,
        HostEndpointUpdate,
        VXLANTunnelEndpointUpdate,
    )
    from pyfelix.agent.shims.cmd import NetnsCommandRunner

    ns = namespaces[0]
    runner = NetnsCommandRunner(ns)
    host_ips = HostIPsManager(runner=runner)
    manager = IptablesManager(runner=runner, backend=backend,
                              host_endpoints_only=mode == "bpf")
    allow = (Rule(action="allow", protocol=6),)
    msgs = [
        ActivePolicyUpdate(PolicyID("default", "n"), Policy(inbound_rules=allow,
                                                            apply_on_forward=True)),
        ActivePolicyUpdate(PolicyID("default", "u"), Policy(inbound_rules=allow,
                                                            outbound_rules=allow,
                                                            untracked=True)),
        ActivePolicyUpdate(PolicyID("default", "p"), Policy(inbound_rules=allow,
                                                            pre_dnat=True)),
        VXLANTunnelEndpointUpdate("node2", "02:00:00:00:00:02", "10.65.255.2", "198.18.0.2"),
        HostEndpointUpdate(HostEndpointID("h"), HostEndpoint(
            name="eth0", tiers=(TierInfo("default", ingress_policies=("n",)),),
            forward_tiers=(TierInfo("default", ingress_policies=("n",)),),
            untracked_tiers=(TierInfo("default", ingress_policies=("u",),
                                      egress_policies=("u",)),),
            pre_dnat_tiers=(TierInfo("default", ingress_policies=("p",)),))),
        OPEN,
        endpoint(),
        InSync(),
    ]
    for msg in msgs:
        host_ips.on_update(msg)
        manager.on_update(msg)
    for step in (host_ips.apply, manager.apply, manager.finish_apply):
        step()
    save = BACKENDS[backend].save
    raw = sh(ns, save, "-t", "raw")
    assert "cali-fh-eth0" in raw and "cali-th-eth0" in raw and "--notrack" in raw
    assert "cali-fh-eth0" in sh(ns, save, "-t", "mangle")
    filter_table = sh(ns, save, "-t", "filter")
    assert "cali-fhfw-eth0" in filter_table and "cali40all-vxlan-net" in filter_table
    assert "--dport 22" in filter_table  # failsafes
    workload_chains = ("cali-tw-cali1", "cali-fw-cali1", "cali-from-wl-dispatch",
                       "cali-wl-to-host")
    if mode == "bpf":
        assert not any(name in filter_table for name in workload_chains)
    else:
        assert all(name in filter_table for name in workload_chains)
    restores = manager.table.restore_calls
    manager.request_resync()
    manager.apply()
    assert manager.table.restore_calls == restores
