"""The flood generator itself (pyfelix/bench/c/flow_flood.c), between two namespaces this
test creates and removes (`pyff<pid>-gen` with the sender's eth0, `pyff<pid>-sink` with its
veth peer, no agent): the frames that arrive are what test_lab_flow_logs.py's flood claims
they are, each read back from a packet socket on the peer:
- Ethernet from the interface's own MAC to the given gateway MAC, IPv4/UDP from SRC to DST;
- right IP header and UDP checksums (a wrong one would be dropped by the receiving stack or
  conntrack as invalid before any policy, and the flood would not load the flow logs);
- a new 5-tuple each, the destination ports within the given range;
- exactly COUNT frames, as the generator reports and the peer's rx counter counts.
Bad arguments exit 2 with a message naming the argument."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pyfelix.agent.bpf import packets
from pyfelix.lab.netns import create_netns, in_netns, remove_netns
from tests.privileged.lab.flow_flood import FLOOD_SOURCE, _link_counters

pytestmark = pytest.mark.privileged

GATEWAY_MAC = "ee:ee:ee:ee:ee:ee"
SRC, DST = "10.250.0.1", "10.250.0.2"
COUNT, DPORTS, FIRST_DPORT = 3000, 8, 100
ETH_P_IP = 0x0800


def _check_frame(frame: bytes, sender_mac: bytes) -> tuple[int, int]:
    """Assert one frame is right; return its (source port, destination port)."""
    dst_mac, src_mac, ethertype = frame[:6], frame[6:12], struct.unpack("!H", frame[12:14])[0]
    assert (dst_mac.hex(":"), src_mac, ethertype) == (GATEWAY_MAC, sender_mac, ETH_P_IP)
    ip = frame[14:34]
    assert ip[0] == 0x45 and ip[9] == socket.IPPROTO_UDP, ip.hex()
    assert packets.checksum(ip) == 0, f"bad IP checksum: {ip.hex()}"
    assert (socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])) == (SRC, DST)
    total_length = struct.unpack("!H", ip[2:4])[0]
    udp = frame[34:14 + total_length]
    sport, dport, udp_length, checksum = struct.unpack("!HHHH", udp[:8])
    assert udp_length == len(udp) and checksum != 0, udp.hex()
    pseudo = ip[12:20] + struct.pack("!BBH", 0, socket.IPPROTO_UDP, udp_length)
    assert packets.checksum(pseudo + udp) == 0, f"bad UDP checksum: {udp.hex()}"
    return sport, dport


@pytest.fixture
def veth_pair(root_guard: Any) -> Any:
    gen, sink = f"pyff{os.getpid()}-gen", f"pyff{os.getpid()}-sink"
    create_netns(gen)
    try:
        create_netns(sink)
        try:
            for cmd in (
                ["ip", "-n", gen, "link", "add", "eth0", "type", "veth", "peer", "name",
                 "sink0", "netns", sink],
                ["ip", "-n", sink, "link", "set", "sink0", "address", GATEWAY_MAC, "up"],
                ["ip", "-n", gen, "link", "set", "eth0", "up"],
                ["ip", "-n", gen, "addr", "add", f"{SRC}/32", "dev", "eth0"],
                ["ip", "-n", sink, "addr", "add", f"{DST}/24", "dev", "sink0"],
            ):
                subprocess.run(cmd, check=True, timeout=30)
            yield gen, sink
        finally:
            remove_netns(sink)
    finally:
        remove_netns(gen)
    root_guard.check()


@pytest.fixture(scope="module")
def flood(tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary = tmp_path_factory.mktemp("flood") / "flow_flood"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", str(binary), str(FLOOD_SOURCE)],
                   check=True, timeout=120)
    return binary


def test_frames_are_new_flows_with_right_checksums(veth_pair: tuple[str, str],
                                                   flood: Path) -> None:
    gen, sink = veth_pair
    with in_netns(sink):
        capture = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
    sender_mac = bytes.fromhex(_mac_of(gen, "eth0").replace(":", ""))
    with capture:
        capture.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        capture.bind(("sink0", ETH_P_IP))
        capture.settimeout(2.0)
        before = _link_counters(sink, "sink0")
        proc = subprocess.run(
            ["nsenter", f"--net=/run/netns/{gen}", str(flood), "eth0", GATEWAY_MAC, SRC, DST,
             "100000", str(COUNT), str(DPORTS), str(FIRST_DPORT)],
            capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        sent, seconds, errors = proc.stdout.split()
        assert (int(sent), int(errors)) == (COUNT, 0) and float(seconds) > 0, proc.stdout
        tuples = []
        while len(tuples) < COUNT:
            try:
                frame = capture.recv(2048)
            except TimeoutError:
                break
            if frame[23] == socket.IPPROTO_UDP and frame[26:30] == socket.inet_aton(SRC):
                tuples.append(_check_frame(frame, sender_mac))
        received = _link_counters(sink, "sink0") - before
    assert len(tuples) == COUNT and received.rx_packets >= COUNT, (len(tuples), received)
    assert len(set(tuples)) == COUNT, "a 5-tuple repeated"
    assert {dport for _, dport in tuples} == set(range(FIRST_DPORT, FIRST_DPORT + DPORTS))
    assert all(1024 <= sport <= 65535 for sport, _ in tuples)


def _mac_of(netns: str, ifname: str) -> str:
    proc = subprocess.run(["ip", "-n", netns, "-j", "link", "show", "dev", ifname],
                          capture_output=True, text=True, check=True, timeout=30)
    return str(json.loads(proc.stdout)[0]["address"])


@pytest.mark.parametrize(("args", "named"), [
    (["eth0", "ee:ee:ee", SRC, DST, "1000", "10"], "DST_MAC"),
    (["eth0", GATEWAY_MAC, "10.250.0", DST, "1000", "10"], "SRC or DST"),
    (["eth0", GATEWAY_MAC, SRC, DST, "0", "10"], "RATE, COUNT"),
    (["eth0", GATEWAY_MAC, SRC, DST, "1000", "10", "8", "65535"], "FIRST_DPORT"),
])
def test_bad_arguments_are_named(flood: Path, args: list[str], named: str) -> None:
    proc = subprocess.run([str(flood), *args], capture_output=True, text=True, timeout=30,
                          check=False)
    assert proc.returncode == 2 and named in proc.stderr, (proc.returncode, proc.stderr)
