"""Fail closed, on both dataplanes, with a real agent in a lab node namespace.

1. Forged sources: pod x/a sends TCP SYNs and UDP with the source of pod x/b, of the node,
   and of 203.0.113.9 (outside every pool) to pod x/c, whose policy allows everything. A
   sniffer in x/c's namespace sees none of them, while a's genuine packets arrive. With
   203.0.113.0/24 in a's `cni.projectcalico.org/allowedSourcePrefixes` (Calico's pod
   annotation for allowSpoofedSourcePrefixes) the forged 203.0.113.9 arrives; x/b's address
   still does not.
2. IPv6: a and c get IPv6 addresses and routes by hand (no ND needed: permanent neighbour
   entries). UDP over IPv6 from a to c never arrives, and the dataplane's own counter says
   why: the datastore gives the pods no IPv6 address, so both dataplanes drop it at the
   IPv6 source check (BPF: drop reason `spoofed_source`; iptables: the packets of the IPv6
   source check's drop rule).
3. BPF mode, no unpoliced window: the agent is SIGKILLed; a held TCP connection keeps
   echoing; a new pod interface (created as the CNI would, while no agent runs) reaches
   neither a pod nor the node; once the agent is back and its pod is in the datastore it
   does, and the guard counted the drops.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pyfelix.agent.shims.nft_guard import NftGuard
from pyfelix.lab.datastore import topology_documents
from pyfelix.lab.naming import workload_interface_name
from pyfelix.lab.netns import create_netns, in_netns
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import parse_scenario
from tests.privileged.packet_probe import TCP, UDP, RawSender, Sniffer
from tests.privileged.reliability.harness import AgentUnderTest

pytestmark = pytest.mark.privileged

SCENARIO = {
    "name": "fail-closed",
    "namespaces": [{"name": "x"}],
    "pods": [
        {"namespace": "x", "name": "a", "ip": "10.65.0.1", "ports": [{"port": 80}]},
        {"namespace": "x", "name": "b", "ip": "10.65.0.2", "ports": [{"port": 80}]},
        {"namespace": "x", "name": "c", "ip": "10.65.0.3", "ports": [{"port": 80}]},
    ],
}
DATAPLANES = ["iptables", "bpf"]
OUTSIDE = "203.0.113.9"
PORT = 7777


@contextlib.contextmanager
def lab(dataplane: str) -> Iterator[tuple[LabRunner, AgentUnderTest]]:
    agent = AgentUnderTest({"FELIX_BPFENABLED": "true" if dataplane == "bpf" else "false"},
                           keep_host_mounts=True)
    runner = LabRunner(parse_scenario(SCENARIO, source="<fail-closed>"), agents=agent,
                       program_routes=False, probe_timeout=0.5)
    with runner:
        runner.build()
        runner.start_agents()
        runner.wait_in_sync()
        yield runner, agent


def sh(netns: str, *argv: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, *argv], check=True,
                          capture_output=True, text=True, timeout=30).stdout


def send_forged(netns: str, src: str, dst: str) -> None:
    """One TCP SYN and one UDP datagram to PORT from `netns` with source `src`."""
    sender = RawSender(netns)
    try:
        sender.send(src, dst, TCP, PORT)
        sender.send(src, dst, UDP, PORT, sport=40001)
    finally:
        sender.close()


def bpf_drops(agent: AgentUnderTest, reason: str) -> float:
    """The agent's `pyfelix_bpf_dropped_packets_total{reason}` (read from the programs'
    global counters at scrape time)."""
    return agent.metrics().get(f'pyfelix_bpf_dropped_packets_total{{reason="{reason}"}}', 0.0)


def ip6tables_drops(netns: str) -> int:
    """Packets counted by the ip6tables rules that drop a workload's IPv6 sources it was
    not given (the lab's pods have no IPv6 address in the datastore, so all of theirs)."""
    total = 0
    for binary in ("ip6tables-nft-save", "ip6tables-legacy-save"):
        with contextlib.suppress(subprocess.CalledProcessError, FileNotFoundError):
            for line in sh(netns, binary, "-c").splitlines():
                if ("spoofed source" in line and "-j DROP" in line and line.startswith("[")
                        and " -A cali-ws-" in line):
                    total += int(line[1:].split(":")[0])
    return total


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dataplane", DATAPLANES)
def test_forged_sources_never_arrive_unless_allowed(dataplane: str, root_guard: Any) -> None:
    with lab(dataplane) as (runner, agent):
        pods = runner.topology.pods
        a, c = pods["x/a"], pods["x/c"]
        node_ip = str(runner.topology.nodes[agent.node].ip)
        sniffer = Sniffer(c.netns)
        try:
            for forged in ("10.65.0.2", node_ip, OUTSIDE):
                send_forged(a.netns, forged, "10.65.0.3")
            send_forged(a.netns, "10.65.0.1", "10.65.0.3")  # genuine: the path works
            assert sniffer.wait_for("10.65.0.1", TCP, PORT), sniffer.seen
            assert sniffer.wait_for("10.65.0.1", UDP, PORT), sniffer.seen
            for forged in ("10.65.0.2", node_ip, OUTSIDE):
                for proto in (TCP, UDP):
                    assert not sniffer.saw(forged, proto, PORT), (dataplane, forged, proto)
            if dataplane == "bpf":
                assert bpf_drops(agent, "spoofed_source") >= 6
                spoofed = {k: v for k, v in agent.metrics().items()
                           if k.startswith("pyfelix_bpf_endpoint_spoofed_packets_total")}
                assert spoofed.get(
                    'pyfelix_bpf_endpoint_spoofed_packets_total{endpoint="x/a/eth0"}', 0) >= 6, \
                    spoofed
            # allowSpoofedSourcePrefixes, as Calico's pod annotation
            doc = next(d for d in topology_documents(runner.scenario, runner.topology)
                       if d["kind"] == "Pod" and d["metadata"]["name"] == "a")
            doc["metadata"]["annotations"]["cni.projectcalico.org/allowedSourcePrefixes"] = \
                json.dumps(["203.0.113.0/24"])
            runner.apply_resources([doc])
            runner.wait_in_sync()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not sniffer.saw(OUTSIDE, UDP, PORT):
                send_forged(a.netns, OUTSIDE, "10.65.0.3")
                time.sleep(0.3)
            assert sniffer.saw(OUTSIDE, TCP, PORT) and sniffer.saw(OUTSIDE, UDP, PORT), dataplane
            send_forged(a.netns, "10.65.0.2", "10.65.0.3")
            time.sleep(0.5)
            assert not sniffer.saw("10.65.0.2", UDP, PORT), dataplane
        finally:
            sniffer.close()


def give_ipv6(runner: LabRunner, agent: AgentUnderTest, pod: str, address: str) -> None:
    """An IPv6 address for `pod`, a default route via fe80::1 (the host side, MAC fixed) and
    the node's route and neighbour entry back: forwarding works without any ND."""
    handle = runner.topology.pods[pod]
    sh(handle.netns, "ip", "-6", "addr", "add", f"{address}/128", "dev", "eth0", "nodad")
    sh(handle.netns, "ip", "-6", "neigh", "replace", "fe80::1", "lladdr", "ee:ee:ee:ee:ee:ee",
       "dev", "eth0", "nud", "permanent")
    sh(handle.netns, "ip", "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0")
    mac = sh(handle.netns, "cat", "/sys/class/net/eth0/address").strip()
    sh(agent.netns, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
    sh(agent.netns, "ip", "-6", "route", "replace", f"{address}/128", "dev",
       handle.host_ifname)
    sh(agent.netns, "ip", "-6", "neigh", "replace", address, "lladdr", mac, "dev",
       handle.host_ifname, "nud", "permanent")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dataplane", DATAPLANES)
def test_ipv6_between_pods_is_dropped_and_counted(dataplane: str, root_guard: Any) -> None:
    with lab(dataplane) as (runner, agent):
        give_ipv6(runner, agent, "x/a", "fd00:65::1")
        give_ipv6(runner, agent, "x/c", "fd00:65::3")
        pods = runner.topology.pods
        # the pods' IPv6 addresses are not in the datastore: both dataplanes drop them at
        # the IPv6 source check (BPF: spoofed_source)
        before = (bpf_drops(agent, "spoofed_source") if dataplane == "bpf"
                  else ip6tables_drops(agent.netns))
        sniffer = Sniffer(pods["x/c"].netns)
        try:
            with in_netns(pods["x/a"].netns):
                sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            with sock:
                for _ in range(5):
                    sock.sendto(b"v6", ("fd00:65::3", PORT))
            time.sleep(0.5)
            assert not sniffer.saw("fd00:65::1", UDP, PORT), dataplane
        finally:
            sniffer.close()
        after = (bpf_drops(agent, "spoofed_source") if dataplane == "bpf"
                 else ip6tables_drops(agent.netns))
        assert after - before >= 5, (dataplane, before, after)


def tcp_ok(netns: str, ip: str, port: int, timeout: float = 1.0) -> bool:
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect((ip, port))
            return True
        except OSError:
            return False


def reached_node(netns: str, ip: str, port: int) -> bool:
    """True if anything answered (a connection or a RST from a closed port)."""
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(1.0)
        try:
            sock.connect((ip, port))
            return True
        except ConnectionRefusedError:
            return True
        except OSError:
            return False


def new_pod_interface(runner: LabRunner, agent: AgentUnderTest, ip: str) -> tuple[str, str]:
    """What the CNI plugin does for a new pod, with no agent involved: (netns, host iface)."""
    netns = f"{runner.run_id}-p-x.new"
    iface = workload_interface_name("x", "new", "cali")  # the name its endpoint will have
    create_netns(netns)
    sh(agent.netns, "ip", "link", "add", iface, "address", "ee:ee:ee:ee:ee:ee", "type", "veth",
       "peer", "name", "eth0", "netns", netns)
    sh(agent.netns, "ip", "link", "set", iface, "up")
    sh(agent.netns, "ip", "route", "add", f"{ip}/32", "dev", iface)
    sh(agent.netns, "sysctl", "-qw", f"net.ipv4.conf.{iface}.proxy_arp=1")
    for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", f"{ip}/32", "dev", "eth0"],
                ["ip", "link", "set", "eth0", "up"],
                ["ip", "neigh", "add", "169.254.1.1", "lladdr", "ee:ee:ee:ee:ee:ee", "dev", "eth0",
                 "nud", "permanent"],
                ["ip", "route", "add", "169.254.1.1/32", "dev", "eth0", "scope", "link"],
                ["ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0"]):
        sh(netns, *cmd)
    return netns, iface


class Echo:
    """A TCP echo server in `netns` and one held connection to it from `client_ns`."""

    def __init__(self, netns: str, ip: str, port: int, client_ns: str) -> None:
        with in_netns(netns):
            self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((ip, port))
        self._server.listen(8)
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        with in_netns(client_ns):
            self.client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.client.settimeout(2.0)
        self.client.connect((ip, port))

    def _serve(self) -> None:
        conns = []
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                conn, _ = self._server.accept()
                conns.append(conn)
                threading.Thread(target=self._echo, args=(conn,), daemon=True).start()
        for conn in conns:
            conn.close()

    def _echo(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(64):
                conn.sendall(data)

    def alive(self) -> bool:
        try:
            self.client.sendall(b"ping")
            return self.client.recv(64) == b"ping"
        except OSError:
            return False

    def close(self) -> None:
        self._stop.set()
        self.client.close()
        self._thread.join(2)
        self._server.close()


@pytest.mark.timeout(300)
def test_bpf_new_interface_is_closed_while_the_agent_is_down(root_guard: Any) -> None:
    with lab("bpf") as (runner, agent):
        pods = runner.topology.pods
        a, b = pods["x/a"], pods["x/b"]
        node_ip = str(runner.topology.nodes[agent.node].ip)
        echo = Echo(b.netns, "10.65.0.2", 5001, a.netns)
        netns = None
        try:
            assert echo.alive()
            agent.kill9()
            netns, _iface = new_pod_interface(runner, agent, "10.65.0.9")
            for _ in range(3):  # nothing crosses, to a pod or to the node
                assert not tcp_ok(netns, "10.65.0.2", 5001)
                assert not reached_node(netns, node_ip, 9)
                assert echo.alive()  # the existing flow is untouched
                assert tcp_ok(a.netns, "10.65.0.2", 5001)  # and existing pods keep policy
            guard = NftGuard(netns=agent.netns).counters()
            assert guard.get("from_unprogrammed", 0) >= 3, guard
            # the agent comes back and the pod is in the datastore: now it is policed (its
            # namespace's profile allows) and reaches b
            agent.spawn()
            doc = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "new", "namespace": "x", "annotations": {
                       "cni.projectcalico.org/podIP": "10.65.0.9/32"}},
                   "spec": {"nodeName": agent.node, "containers": [{"name": "main"}]},
                   "status": {"phase": "Running", "podIP": "10.65.0.9",
                              "podIPs": [{"ip": "10.65.0.9"}]}}
            runner.apply_resources([doc])
            runner.wait_in_sync()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not tcp_ok(netns, "10.65.0.2", 5001):
                time.sleep(0.2)
            assert tcp_ok(netns, "10.65.0.2", 5001)
            assert echo.alive()
        finally:
            echo.close()
            if netns is not None:
                subprocess.run(["ip", "netns", "del", netns], check=False)


HOST_ENDPOINT_DOCS = [
    {"apiVersion": "projectcalico.org/v3", "kind": "Profile",
     "metadata": {"name": "open-host"},
     "spec": {"ingress": [{"action": "Allow"}], "egress": [{"action": "Allow"}]}},
    {"apiVersion": "projectcalico.org/v3", "kind": "HostEndpoint",
     "metadata": {"name": "node1-eth0"},
     "spec": {"node": "node1", "interfaceName": "eth0", "profiles": ["open-host"]}},
]


@pytest.mark.timeout(240)
def test_bpf_host_endpoint_reverse_path_check(root_guard: Any) -> None:
    """BPFEnforceRPF on a host endpoint: a packet arriving on the node's eth0 with the
    source of a local pod (whose route leads out of a cali interface) is dropped in Strict
    mode and passes once the FelixConfiguration says Disabled. The kernel's rp_filter is
    off on eth0 here, so what drops is the BPF program."""
    from tests.privileged.felix_extras.extras_lab import ExternalHost

    with lab("bpf") as (runner, agent):
        sh(agent.netns, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0",
           "net.ipv4.conf.eth0.rp_filter=0")
        runner.apply_resources(HOST_ENDPOINT_DOCS)
        runner.wait_in_sync()
        node_ip = str(runner.topology.nodes[agent.node].ip)
        ext = ExternalHost(runner, routes={"10.65.0.0/16": node_ip}).create()
        c = runner.topology.pods["x/c"]
        sniffer = Sniffer(c.netns)
        try:
            deadline = time.monotonic() + 15  # the program is attached after in-sync
            while time.monotonic() < deadline and "calico_from_hep" not in sh(
                    agent.netns, "tc", "filter", "show", "dev", "eth0", "ingress"):
                time.sleep(0.2)
            send_forged(ext.netns, ext.address, "10.65.0.3")  # genuine: the path works
            send_forged(ext.netns, "10.65.0.2", "10.65.0.3")  # a local pod's address
            time.sleep(0.5)
            assert sniffer.saw(ext.address, UDP, PORT), sniffer.seen
            assert not sniffer.saw("10.65.0.2", UDP, PORT)
            assert bpf_drops(agent, "host_endpoint_rpf") >= 2
            runner.apply_resources([{
                "apiVersion": "projectcalico.org/v3", "kind": "FelixConfiguration",
                "metadata": {"name": "default"}, "spec": {"bpfEnforceRPF": "Disabled"}}])
            runner.wait_in_sync()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not sniffer.saw("10.65.0.2", UDP, PORT):
                send_forged(ext.netns, "10.65.0.2", "10.65.0.3")
                time.sleep(0.3)
            assert sniffer.saw("10.65.0.2", UDP, PORT)
        finally:
            sniffer.close()
            subprocess.run(["ip", "netns", "del", ext.netns], check=False)
