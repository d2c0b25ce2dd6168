"""Tunnel packets reach a node only from known nodes: cali-INPUT accepts IPIP (IP protocol
4) from `cali40all-hosts-net` and VXLAN (UDP to VXLANPort) from `cali40all-vxlan-net`, and
drops the rest - in both dataplane modes (BPF mode keeps these host rules), with real
iptables and real packets.

Two namespaces joined by a veth: the node (198.18.0.1) runs the IptablesManager fed with
the tunnel messages of two nodes (itself and 198.18.0.2); the sender holds 198.18.0.2 (a
known node) and 198.18.0.3 (not a node) and sends one IPIP and one VXLAN packet from each.
The rules' packet counters must show one accepted and one dropped of each kind. This needs
no IPIP support in the kernel: netfilter's INPUT hook sees the packet before protocol
dispatch, so it checks the IPIP half of Felix's cali-INPUT on a kernel without tunl0 too.
"""

from __future__ import annotations

import socket

import pytest

from pyfelix.agent.dataplane.managers.ipsets import IPSetsManager
from pyfelix.agent.dataplane.managers.iptables import IptablesManager
from pyfelix.agent.proto import InSync, IPIPTunnelUpdate, VXLANTunnelEndpointUpdate
from pyfelix.lab.netns import in_netns
from tests.privileged.dataplane.dp_netns import CountingRunner, in_ns

pytestmark = pytest.mark.privileged

NODE_IP, KNOWN_IP, STRANGER_IP = "198.18.0.1", "198.18.0.2", "198.18.0.3"


def _send(netns: str, source: str) -> None:
    with in_netns(netns):
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, 4)  # IPIP: payload = inner header
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with raw, udp:
        raw.bind((source, 0))
        raw.sendto(bytes(20), (NODE_IP, 0))
        udp.bind((source, 0))
        udp.sendto(b"x" * 16, (NODE_IP, 4789))


def _input_counts(netns: str) -> dict[str, int]:
    listing = in_ns(netns, "iptables", "-t", "filter", "-L", "cali-INPUT", "-v", "-x", "-n")
    counts: dict[str, int] = {}
    for line in listing.splitlines()[2:]:
        fields = line.split()
        if len(fields) < 4:
            continue
        proto = fields[3]
        kind = ("ipip" if proto in ("4", "ipencap") else
                "vxlan" if "dpt:4789" in line else "")
        if kind:
            verdict = "accept" if fields[2] == "ACCEPT" else "drop"
            counts[f"{kind}-{verdict}"] = counts.get(f"{kind}-{verdict}", 0) + int(fields[0])
    return counts


@pytest.mark.parametrize("bpf_mode", [False, True])
def test_tunnel_packets_only_from_known_nodes(make_netns, bpf_mode: bool) -> None:
    node, sender = make_netns(), make_netns()
    in_ns(node, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0",
          "netns", f"/run/netns/{sender}")
    in_ns(node, "ip", "addr", "add", f"{NODE_IP}/24", "dev", "eth0")
    in_ns(node, "ip", "link", "set", "eth0", "up")
    for address in (KNOWN_IP, STRANGER_IP):
        in_ns(sender, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
    in_ns(sender, "ip", "link", "set", "eth0", "up")
    runner = CountingRunner(node)
    managers = [IPSetsManager(runner=runner),
                IptablesManager(runner=runner, host_endpoints_only=bpf_mode)]
    messages = [IPIPTunnelUpdate("node1", "10.65.255.1", NODE_IP),
                IPIPTunnelUpdate("node2", "10.65.255.2", KNOWN_IP),
                VXLANTunnelEndpointUpdate("node1", "02:00:00:00:00:01", "10.65.254.1", NODE_IP),
                VXLANTunnelEndpointUpdate("node2", "02:00:00:00:00:02", "10.65.254.2",
                                          KNOWN_IP),
                InSync()]
    for msg in messages:
        for manager in managers:
            manager.on_update(msg)
    for manager in managers:
        manager.apply()
    assert "cali40all-hosts-net" in in_ns(node, "ipset", "list", "-n")
    assert _input_counts(node) == {"ipip-accept": 0, "ipip-drop": 0, "vxlan-accept": 0,
                                   "vxlan-drop": 0}
    _send(sender, KNOWN_IP)
    _send(sender, STRANGER_IP)
    assert _input_counts(node) == {"ipip-accept": 1, "ipip-drop": 1, "vxlan-accept": 1,
                                   "vxlan-drop": 1}
