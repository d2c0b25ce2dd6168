"""Real kernel, iptables mode: the workload source check and IPv6 fail closed.

Topology (namespaces this test creates): a router running the whole Linux dataplane
(`LinuxDataplane`, iptables mode, allow-all profiles) and two workloads, A (10.65.0.1) on
cali1 and B (10.65.0.2) on cali2, as in test_priv_dp_iptables.py. B's eth0 is watched by an
AF_PACKET sniffer, so "reached B" means "B's interface received it", whatever B's own stack
then makes of it. A forges packets with a raw socket (IP_HDRINCL).

- (a) UDP and TCP from A with a forged source (B's address, 203.0.113.9) never reach B, while
  the same packets with A's own source do; the raw table's "pyfelix: spoofed source" DROP
  counted them;
- (b) with 203.0.113.0/24 in A's allow_spoofed_source_prefixes, rp_filter on cali1 goes to 0
  and 203.0.113.9 reaches B; B's address is still refused (only the raw check is left to
  refuse it: rp_filter is off);
- (c) IPv6 between A and B (addresses and routes added by hand; A routes via the router's
  link-local address) passes before the dataplane runs, is dropped once it does, and the
  ip6tables "pyfelix: ipv6 not policed" FORWARD drop counter grows - also after A's
  neighbour cache was flushed, so neighbour discovery with the host still works.

Each "does not reach" is judged against a genuine packet sent after it on the same path: when
the genuine one has arrived, the forged one would have too.
"""

from __future__ import annotations

import itertools
import re
import socket
import time
from collections.abc import Callable

import pytest

from pyfelix.agent.dataplane.iptables.names import COMMENT_SPOOFED_SOURCE
from pyfelix.agent.dataplane.iptables.restore import BACKENDS, BACKENDS6
from pyfelix.agent.dataplane.linux import LinuxDataplane, LinuxDataplaneConfig
from pyfelix.agent.proto import (
    ActiveProfileUpdate,
    InSync,
    Profile,
    Rule,
    WorkloadEndpoint,
    WorkloadEndpointID,
    WorkloadEndpointUpdate,
)
from pyfelix.agent.shims.netns import NetnsThread
from tests.privileged.dataplane.dp_netns import in_ns
from tests.privileged.packet_probe import TCP, UDP, RawSender, Sniffer

pytestmark = pytest.mark.privileged

A, B, OUTSIDE = "10.65.0.1", "10.65.0.2", "203.0.113.9"
A6, B6 = "fd00:65::1", "fd00:65::2"
OPEN = ActiveProfileUpdate("open", Profile(inbound_rules=(Rule(action="allow"),),
                                           outbound_rules=(Rule(action="allow"),)))
_PORTS = itertools.count(21000)


def _ep(iface: str, ip: str, spoof: tuple[str, ...] = ()) -> WorkloadEndpointUpdate:
    return WorkloadEndpointUpdate(
        WorkloadEndpointID("k8s", f"ns/{iface}", "eth0"),
        WorkloadEndpoint(state="active", name=iface, ipv4_nets=(f"{ip}/32",),
                         profile_ids=("open",), allow_spoofed_source_prefixes=spoof))


# --- packets (forged with tests.privileged.packet_probe) -----------------------------------


class Forger(RawSender):
    """Hand-built IPv4 packets from a workload namespace, each to a port of its own."""

    def send(self, src: str, proto: int, dst: str = B) -> int:  # type: ignore[override]
        """Sends one packet; returns its (unique) destination port."""
        dport = next(_PORTS)
        super().send(src, dst, proto, dport)
        return dport


def _forged_dropped(forger: Forger, sniffer: Sniffer, forged_src: str, proto: int) -> bool:
    """A forged packet, then a genuine one (A's own source) on the same path: True when the
    genuine one reached B and the forged one did not."""
    forged = forger.send(forged_src, proto)
    genuine = forger.send(A, proto)
    assert sniffer.wait_for(A, proto, genuine), "genuine packet from A did not reach B"
    time.sleep(0.1)
    return not sniffer.saw(forged_src, proto, forged)


# --- the router's view ---------------------------------------------------------------------------


def _counter(save_text: str, chain: str, comment: str) -> int:
    """Packets counted by the rule of `chain` carrying `comment` (iptables-save -c output);
    summed when there are several (one per interface prefix)."""
    total, found = 0, False
    for line in save_text.splitlines():
        m = re.match(r"\[(\d+):\d+\] -A (\S+) (.*)", line)
        if m and m.group(2) == chain and comment in m.group(3):
            total += int(m.group(1))
            found = True
    assert found, f"no rule in {chain} with comment {comment!r}:\n{save_text}"
    return total


def _wait(pred: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _workload(router: str, wl: str, iface: str, ip: str) -> None:
    in_ns(router, "ip", "link", "add", iface, "type", "veth", "peer", "name", "eth0",
          "netns", f"/run/netns/{wl}")
    in_ns(wl, "ip", "addr", "add", f"{ip}/32", "dev", "eth0")
    in_ns(wl, "ip", "link", "set", "eth0", "up")
    in_ns(wl, "ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
    in_ns(wl, "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
    in_ns(router, "ip", "link", "set", iface, "up")


def _link_local(ns: str, iface: str) -> str | None:
    """The interface's link-local address once DAD is done (None before)."""
    out = in_ns(ns, "ip", "-6", "-o", "addr", "show", "dev", iface, "scope", "link")
    m = re.search(r"inet6 (fe80::[0-9a-f:]+)/64", out)
    return m.group(1) if m and "tentative" not in out else None


def _ipv6_by_hand(router: str, a_ns: str, b_ns: str) -> None:
    """IPv6 addresses on A and B, routes on the router, A's route via the router's
    link-local address on cali1 (no agent involvement)."""
    in_ns(router, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
    for ns, ip, iface in ((a_ns, A6, "cali1"), (b_ns, B6, "cali2")):
        in_ns(ns, "ip", "-6", "addr", "add", f"{ip}/128", "dev", "eth0", "nodad")
        in_ns(router, "ip", "-6", "route", "add", f"{ip}/128", "dev", iface)
    _wait(lambda: _link_local(router, "cali1") is not None, "the router's link-local on cali1")
    _wait(lambda: _link_local(b_ns, "eth0") is not None, "B's link-local address")
    gateway = _link_local(router, "cali1")
    assert gateway is not None
    in_ns(a_ns, "ip", "-6", "route", "add", "default", "via", gateway, "dev", "eth0")


def _send_udp6(thread: NetnsThread) -> int:
    dport = next(_PORTS)

    def send() -> None:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.sendto(b"pyfelix", (B6, dport))

    thread.call(send)
    return dport


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_forged_sources_and_ipv6_do_not_reach_another_pod(make_netns, backend: str,
                                                          record_property) -> None:
    router, a_ns, b_ns = make_netns(), make_netns(), make_netns()
    # an "uplink" so the router has a route to 169.254.1.1 for proxy ARP (as in
    # test_priv_dp_iptables.py) and a default route out (where 203.0.113.9 lives)
    in_ns(router, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1")
    in_ns(router, "ip", "link", "set", "up1", "up")
    in_ns(router, "ip", "link", "set", "up0", "up")
    in_ns(router, "ip", "route", "add", "default", "dev", "up0")
    _workload(router, a_ns, "cali1", A)
    _workload(router, b_ns, "cali2", B)
    _ipv6_by_hand(router, a_ns, b_ns)
    a_thread, b_thread = NetnsThread(a_ns), NetnsThread(b_ns)
    sniffer = Sniffer(b_thread)
    forger = Forger(a_thread)
    dp = LinuxDataplane(netns=router, config=LinuxDataplaneConfig(iptables_backend=backend))
    save4 = (BACKENDS[backend].save, "-c", "-t", "raw")
    save6 = (BACKENDS6[backend].save, "-c", "-t", "filter")

    def spoof_drops() -> int:
        return _counter(in_ns(router, *save4), "cali-ws-cali1", COMMENT_SPOOFED_SOURCE)

    def v6_forward_drops() -> int:
        # A's endpoint declares no IPv6 address: its IPv6 source check drops everything
        return _counter(in_ns(router, *save6), "cali-ws-cali1", COMMENT_SPOOFED_SOURCE)

    try:
        # (c) before the agent: IPv6 from A reaches B (the path works without our rules)
        deadline = time.monotonic() + 10
        while not sniffer.wait_for(A6, UDP, _send_udp6(a_thread), 0.5):
            assert time.monotonic() < deadline, "IPv6 A -> B never worked, even without rules"

        dp.start()
        for msg in (OPEN, _ep("cali1", A), _ep("cali2", B), InSync()):
            dp.enqueue(msg)
        assert dp.loop.in_sync.wait(15)
        t0 = time.monotonic()
        deadline = t0 + 10
        while not sniffer.wait_for(A, UDP, forger.send(A, UDP), 0.5):
            assert time.monotonic() < deadline, "genuine UDP from A never reached B"
        record_property("first_genuine_packet_s", round(time.monotonic() - t0, 3))
        assert in_ns(router, "cat", "/proc/sys/net/ipv4/conf/cali1/rp_filter").strip() == "1"

        # (a) forged sources: dropped, by the raw table's source check
        before = spoof_drops()
        for proto in (UDP, TCP):
            for forged in (B, OUTSIDE):
                assert _forged_dropped(forger, sniffer, forged, proto), (proto, forged)
        assert spoof_drops() >= before + 4

        # (b) A may send from 203.0.113.0/24: rp_filter off on cali1, 203.0.113.9 passes
        dp.enqueue(_ep("cali1", A, spoof=("203.0.113.0/24",)))
        _wait(lambda: in_ns(router, "cat",
                            "/proc/sys/net/ipv4/conf/cali1/rp_filter").strip() == "0",
              "rp_filter 0 on cali1")
        deadline = time.monotonic() + 10
        while not sniffer.wait_for(OUTSIDE, UDP, forger.send(OUTSIDE, UDP), 0.5):
            assert time.monotonic() < deadline, "allowed spoofed source never reached B"
        tcp_port = forger.send(OUTSIDE, TCP)
        assert sniffer.wait_for(OUTSIDE, TCP, tcp_port)
        # B's address is still refused; with rp_filter off, only the raw check can do that
        before = spoof_drops()
        for proto in (UDP, TCP):
            assert _forged_dropped(forger, sniffer, B, proto), proto
        assert spoof_drops() >= before + 2
        assert in_ns(router, "cat", "/proc/sys/net/ipv4/conf/cali2/rp_filter").strip() == "1"

        # (c) IPv6 between the pods: A has no IPv6 address in the datastore, so none of its
        # IPv6 sources is its own: dropped, counted by its IPv6 source check
        before = v6_forward_drops()
        ports = [_send_udp6(a_thread) for _ in range(3)]
        _wait(lambda: v6_forward_drops() >= before + 3, "the IPv6 FORWARD drop counter")
        # neighbour discovery with the host still works: with A's neighbour cache flushed,
        # A must resolve the router's link-local again before its packet can be dropped
        in_ns(a_ns, "ip", "-6", "neigh", "flush", "dev", "eth0")
        before = v6_forward_drops()
        ports.append(_send_udp6(a_thread))
        _wait(lambda: v6_forward_drops() >= before + 1, "the IPv6 drop after re-resolving")
        # and IPv4 between the same pods still flows, so the IPv6 ones had every chance
        assert sniffer.wait_for(A, UDP, forger.send(A, UDP))
        time.sleep(0.2)
        assert not any(sniffer.saw(A6, UDP, port) for port in ports)
        assert not dp.loop.fatal.is_set()
    finally:
        dp.stop()
        sniffer.close()
        forger.close()
        a_thread.close()
        b_thread.close()
