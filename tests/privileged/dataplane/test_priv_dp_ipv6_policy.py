"""IPv6 policy with real traffic, on every dataplane: two pods with IPv4 and IPv6 addresses
behind a router namespace running the whole Linux dataplane (IP sets of both families,
iptables and ip6tables, routes, sysctls, interface monitor), in iptables mode (nft and
legacy backends) and in BPF mode (the BPF managers built inside the router namespace: tc
programs on the pods' veths, maps pinned in a directory of the test's own, removed after).

The router's IPv6 routes to the pods and its IPv6 forwarding come from the managers; the
pods' addresses and default routes (via the router's link-local address on their veth)
are set by hand, as a CNI plugin would.

Checked on each dataplane, with the same helpers and the same cases:
- a policy allowing TCP 8080 from an IP set holding A's IPv4 and IPv6 addresses: A reaches
  B on 8080 over IPv4 and over IPv6; 9090 is refused on both;
- the same allow restricted to `ipVersion: 4` (what a policy written for IPv4 looks like):
  IPv6 8080 is then denied too: IPv6 never gets through a policy that did not allow it;
- neighbour discovery works through the dataplane: with every neighbour cache flushed
  (pods and router), IPv6 connects again (BPF mode: counted as ipv6_nd_passed);
- an IPv6 source A is not given in the datastore (A adds the address itself and sends
  from it) never reaches B, counted by A's IPv6 source check (iptables: the raw-table
  rule's packet counter; BPF: the spoofed_dropped counter).

Also (nft and BPF): IPv6 NAT outgoing and an IPv6 floating IP in ip6tables' nat table,
with an outside host on a third namespace (`test_ipv6_nat_outgoing_and_floating_ip_...`);
and with Ipv6Support false, neither is programmed.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import pytest

from pyfelix.agent.dataplane.iptables.names import COMMENT_IPV6_DISABLED, COMMENT_SPOOFED_SOURCE
from pyfelix.agent.dataplane.iptables.restore import BACKENDS, BACKENDS6
from pyfelix.agent.dataplane.linux import LinuxDataplane, LinuxDataplaneConfig
from pyfelix.agent.proto import (
    ActivePolicyUpdate,
    ActiveProfileUpdate,
    InSync,
    IPSetUpdate,
    Policy,
    PolicyID,
    PortRange,
    Profile,
    Rule,
    TierInfo,
    WorkloadEndpoint,
    WorkloadEndpointID,
    WorkloadEndpointUpdate,
)
from pyfelix.agent.shims.netns import NetnsThread
from tests.privileged.bpf.node_testlib import own_pin_dir, small_maps_config
from tests.privileged.dataplane.dp_netns import in_ns
from tests.privileged.packet_probe import UDP, Sniffer

pytestmark = pytest.mark.privileged

A, B = "10.65.0.1", "10.65.0.2"
A6, B6, FORGED6 = "fd00:65::1", "fd00:65::2", "fd00:65::99"
TCP = 6
OPEN = ActiveProfileUpdate("open", Profile(inbound_rules=(Rule(action="allow"),),
                                           outbound_rules=(Rule(action="allow"),)))
WEB = TierInfo("default", ingress_policies=("web",))


def _ep(iface: str, ip: str, ip6: str, tiers: tuple[TierInfo, ...] = ()
        ) -> WorkloadEndpointUpdate:
    return WorkloadEndpointUpdate(
        WorkloadEndpointID("k8s", f"ns/{iface}", "eth0"),
        WorkloadEndpoint(state="active", name=iface, ipv4_nets=(f"{ip}/32",),
                         ipv6_nets=(f"{ip6}/128",), profile_ids=("open",), tiers=tiers))


def _web(ip_version: int | None) -> ActivePolicyUpdate:
    return ActivePolicyUpdate(PolicyID("default", "web"), Policy(inbound_rules=(
        Rule(action="allow", ip_version=ip_version, protocol=TCP, src_ip_set_ids=("clients",),
             dst_ports=(PortRange(8080, 8080),)),)))


def _wait(pred: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _link_local(ns: str, iface: str) -> str | None:
    out = in_ns(ns, "ip", "-6", "-o", "addr", "show", "dev", iface, "scope", "link")
    m = re.search(r"inet6 (fe80::[0-9a-f:]+)/64", out)
    return m.group(1) if m and "tentative" not in out else None


def _pod(router: str, pod: str, iface: str, ip: str, ip6: str) -> None:
    in_ns(router, "ip", "link", "add", iface, "type", "veth", "peer", "name", "eth0",
          "netns", f"/run/netns/{pod}")
    in_ns(pod, "ip", "addr", "add", f"{ip}/32", "dev", "eth0")
    in_ns(pod, "ip", "-6", "addr", "add", f"{ip6}/128", "dev", "eth0", "nodad")
    in_ns(pod, "ip", "link", "set", "eth0", "up")
    in_ns(pod, "ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
    in_ns(pod, "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
    in_ns(router, "ip", "link", "set", iface, "up")
    _wait(lambda: _link_local(router, iface) is not None, f"the router's link-local on {iface}")
    gateway = _link_local(router, iface)
    assert gateway is not None
    in_ns(pod, "ip", "-6", "route", "add", "default", "via", gateway, "dev", "eth0")


def _listen(thread: NetnsThread, family: int, ip: str, port: int) -> socket.socket:
    def make() -> socket.socket:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((ip, port))
        s.listen(8)
        return s

    srv = thread.call(make)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"hello")

    threading.Thread(target=serve, daemon=True).start()
    return srv


def _connects(thread: NetnsThread, ip: str, port: int, timeout: float = 0.5) -> bool:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET

    def attempt() -> bool:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                s.connect((ip, port))
                return s.recv(5) == b"hello"
            except (TimeoutError, OSError):
                return False

    return thread.call(attempt)


def _eventually(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not pred():
        assert time.monotonic() < deadline, what


def _spoof_drops(router: str, backend: str) -> int:
    """iptables mode: the packets A's IPv6 source-check rule (raw table) dropped."""
    save = in_ns(router, BACKENDS6[backend].save, "-c", "-t", "filter")
    total = 0
    for line in save.splitlines():
        m = re.match(r"\[(\d+):\d+\] -A cali-ws-cali1 (.*)", line)
        if m and COMMENT_SPOOFED_SOURCE in m.group(2):
            total += int(m.group(1))
    return total


@dataclass
class Running:
    """A dataplane running in the router namespace, and how to read what it counted."""

    dp: LinuxDataplane
    spoof_drops: Callable[[], int]  # IPv6 packets dropped by a workload's source check
    nd_passed: Callable[[], int] | None  # BPF: link-scope ND/MLD passed before policy


def _bpf_counter(pin_dir: str, name: str) -> int:
    from pyfelix.agent.bpf.maps import dump_pinned

    (row,) = [r for r in dump_pinned("global_counters", pin_dir) if r["counter"] == name]
    return int(row["value"])


@contextmanager
def _dataplane(mode: str, router: str, *, floating_ips: bool = False) -> Iterator[Running]:
    """`mode`: "nft" / "legacy" (iptables mode with that backend) or "bpf"."""
    with ExitStack() as stack:
        if mode != "bpf":
            dp = LinuxDataplane(netns=router, config=LinuxDataplaneConfig(
                iptables_backend=mode, floating_ips=floating_ips))
            dp.start()
            stack.callback(dp.stop)
            yield Running(dp, lambda: _spoof_drops(router, mode), None)
            return
        from pyfelix.agent.dataplane.bpf_dataplane import build_bpf_managers

        pin_dir = stack.enter_context(own_pin_dir("ipv6"))
        thread = NetnsThread(router)
        stack.callback(thread.close)
        # built and started inside the router namespace: the loop's and the monitor's
        # threads start from there, so everything they do happens in it
        managers = thread.call(build_bpf_managers, small_maps_config(pin_dir))
        dp = thread.call(lambda: LinuxDataplane(
            netns=router, config=LinuxDataplaneConfig(bpf_mode=True, floating_ips=floating_ips),
            extra_managers=managers))
        thread.call(dp.start)
        stack.callback(dp.stop)
        yield Running(dp, lambda: _bpf_counter(pin_dir, "spoofed_dropped"),
                      lambda: _bpf_counter(pin_dir, "ipv6_nd_passed"))


def _router_and_pods(make_netns: Callable[[], str]) -> tuple[str, str, str]:
    """A router namespace with an uplink and default route, and pods A (cali1) and B (cali2)
    with both families' addresses behind it; (router, a_ns, b_ns)."""
    router, a_ns, b_ns = make_netns(), make_netns(), make_netns()
    in_ns(router, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1")
    in_ns(router, "ip", "link", "set", "up1", "up")
    in_ns(router, "ip", "link", "set", "up0", "up")
    in_ns(router, "ip", "route", "add", "default", "dev", "up0")
    _pod(router, a_ns, "cali1", A, A6)
    _pod(router, b_ns, "cali2", B, B6)
    return router, a_ns, b_ns


def _policed_pods() -> tuple[object, ...]:
    """A and B open, B's ingress TCP 8080 allowed from the set holding A's two addresses."""
    return (IPSetUpdate("clients", "net", frozenset({f"{A}/32", f"{A6}/128"})),
            OPEN, _web(None), _ep("cali1", A, A6), _ep("cali2", B, B6, (WEB,)), InSync())


def _flush_neighbours(*namespaces: str) -> None:
    for ns in namespaces:
        in_ns(ns, "ip", "-6", "neigh", "flush", "all")


@pytest.mark.parametrize("mode", ["nft", "legacy", "bpf"])
def test_ipv6_gets_the_same_policy_as_ipv4(make_netns, mode: str, record_property) -> None:
    router, a_ns, b_ns = _router_and_pods(make_netns)
    a_thread, b_thread = NetnsThread(a_ns), NetnsThread(b_ns)
    listeners: list[socket.socket] = []
    sniffer = Sniffer(b_thread)
    try:
        for family, ip in ((socket.AF_INET, B), (socket.AF_INET6, B6)):
            listeners += [_listen(b_thread, family, ip, port) for port in (8080, 9090)]
        with _dataplane(mode, router) as run:
            dp = run.dp
            for msg in _policed_pods():
                dp.enqueue(msg)
            assert dp.loop.in_sync.wait(15)
            if mode == "bpf":  # policy is the tc programs' (iptables: host endpoints only)
                for iface in ("cali1", "cali2"):
                    _wait(lambda i=iface: "pyfelix:calico_to_wep" in in_ns(
                        router, "tc", "filter", "show", "dev", i, "egress"),
                        f"our programs on {iface}")
            assert in_ns(router, "cat", "/proc/sys/net/ipv6/conf/all/forwarding").strip() == "1"
            assert "dev cali2" in in_ns(router, "ip", "-6", "route", "show", f"{B6}/128")
            t0 = time.monotonic()
            _eventually(lambda: _connects(a_thread, B6, 8080), "IPv6 8080 never allowed")
            record_property("first_allowed_ipv6_connection_s", round(time.monotonic() - t0, 3))
            _eventually(lambda: _connects(a_thread, B, 8080), "IPv4 8080 never allowed")
            assert not _connects(a_thread, B6, 9090)  # denied: dropped, the connect times out
            assert not _connects(a_thread, B, 9090)

            # neighbour discovery through the dataplane: every IPv6 neighbour forgotten,
            # the next connection resolves them again
            nd_before = run.nd_passed() if run.nd_passed else 0
            _flush_neighbours(a_ns, b_ns, router)
            _eventually(lambda: _connects(a_thread, B6, 8080),
                        "IPv6 8080 lost after the neighbour caches were flushed")
            if run.nd_passed is not None:
                assert run.nd_passed() > nd_before

            # the allow written for IPv4 only: IPv6 8080 is denied as well
            dp.enqueue(_web(4))
            _eventually(lambda: not _connects(a_thread, B6, 8080),
                        "IPv6 8080 still allowed by an ipVersion 4 rule")
            assert _connects(a_thread, B, 8080)

            # A gives itself an address the datastore does not give it and sends from it:
            # dropped by A's IPv6 source check
            in_ns(a_ns, "ip", "-6", "addr", "add", f"{FORGED6}/128", "dev", "eth0", "nodad")
            before = run.spoof_drops()

            def send_forged() -> None:
                with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
                    s.bind((FORGED6, 0))
                    for _ in range(3):
                        s.sendto(b"pyfelix", (B6, 7000))

            a_thread.call(send_forged)
            _wait(lambda: run.spoof_drops() >= before + 3,
                  "A's IPv6 source check counting the forged packets")
            time.sleep(0.2)
            assert not sniffer.saw(FORGED6, UDP, 7000)
            assert not dp.loop.fatal.is_set()
    finally:
        for s in listeners:
            s.close()
        sniffer.close()
        a_thread.close()
        b_thread.close()


def _holds_ipv6(row: dict) -> bool:
    """A dumped map row with an IPv6 address or prefix in any of its fields."""
    for value in row.values():
        try:
            if ipaddress.ip_network(str(value), strict=False).version == 6:
                return True
        except ValueError:
            continue
    return False


def _ipv6_disabled_drops(router: str, backend: str) -> int:
    """iptables mode, Ipv6Support false: packets the ip6tables drop rules counted."""
    save = in_ns(router, BACKENDS6[backend].save, "-c", "-t", "filter")
    return sum(int(m.group(1)) for line in save.splitlines()
               if (m := re.match(r"\[(\d+):\d+\] -A cali-", line))
               and COMMENT_IPV6_DISABLED in line)


FIP4 = "192.0.2.1"  # A's IPv4 floating IP beside FIP6 (Ipv6Support false: only it works)
FIP6 = "2001:db8:c8::1"  # A's IPv6 floating IP, outside every pool


def _nat6_rules(router: str, backends: dict = BACKENDS6) -> str:
    """The router's ip6tables nat table, both backends (BPF mode picks one itself)."""
    return "".join(in_ns(router, backends[backend].save, "-t", "nat")
                   for backend in ("nft", "legacy"))


def _floating_and_natoutgoing_both_families() -> tuple[object, ...]:
    from pyfelix.agent.proto import IPAMPoolUpdate, NatInfo

    a = _ep("cali1", A, A6)
    return (IPAMPoolUpdate("pool4", "10.65.0.0/16", masquerade=True),
            IPAMPoolUpdate("pool6", "fd00:65::/64", masquerade=True),
            WorkloadEndpointUpdate(a.id, dataclasses.replace(
                a.endpoint, ipv4_nat=(NatInfo(FIP4, A),), ipv6_nat=(NatInfo(FIP6, A6),))))


@pytest.mark.parametrize("mode", ["nft", "bpf"])
def test_ipv6_support_false_drops_workload_ipv6_and_programs_nothing_ipv6(
        make_netns, mode: str) -> None:
    """Ipv6Support false: pods with IPv6 addresses in the datastore, a policy whose IP set
    holds both families. Nothing IPv6 is programmed (no IPv6 route, forwarding, IP-set
    member, BPF map entry or ip6tables policy chain); IPv4 works; and with IPv6 forwarding
    and a route to B added by hand (an operator's doing), A's IPv6 still never reaches B,
    each packet counted as dropped."""
    router, a_ns, b_ns = _router_and_pods(make_netns)
    a_thread, b_thread = NetnsThread(a_ns), NetnsThread(b_ns)
    listeners = [_listen(b_thread, socket.AF_INET, B, 8080),
                 _listen(b_thread, socket.AF_INET6, B6, 8080)]
    sniffer = Sniffer(b_thread)
    try:
        with ExitStack() as stack:
            if mode == "bpf":
                from pyfelix.agent.bpf.maps import dump_pinned
                from pyfelix.agent.dataplane.bpf_dataplane import build_bpf_managers

                pin_dir = stack.enter_context(own_pin_dir("ipv6off"))
                thread = NetnsThread(router)
                stack.callback(thread.close)
                managers = thread.call(build_bpf_managers, small_maps_config(
                    pin_dir, FELIX_IPV6SUPPORT="false"))
                dp = thread.call(lambda: LinuxDataplane(
                    netns=router, config=LinuxDataplaneConfig(
                        bpf_mode=True, ipv6_support=False, floating_ips=True),
                    extra_managers=managers))
                thread.call(dp.start)

                def drops() -> int:
                    return _bpf_counter(pin_dir, "ipv6_dropped")
            else:
                dp = LinuxDataplane(netns=router, config=LinuxDataplaneConfig(
                    iptables_backend=mode, ipv6_support=False, floating_ips=True))
                dp.start()

                def drops() -> int:
                    return _ipv6_disabled_drops(router, mode)
            stack.callback(dp.stop)
            for msg in (*_policed_pods(), *_floating_and_natoutgoing_both_families()):
                dp.enqueue(msg)
            assert dp.loop.in_sync.wait(15)
            _eventually(lambda: _connects(a_thread, B, 8080), "IPv4 8080 never allowed")
            _wait(lambda: FIP4 in _nat6_rules(router, BACKENDS),
                  "the IPv4 floating IP's DNAT")

            # nothing IPv6 programmed (IPv6 NAT outgoing and floating IPs neither)
            assert "cali-" not in _nat6_rules(router)
            assert in_ns(router, "ip", "-6", "route", "show", f"{FIP6}/128").strip() == ""
            assert "cali60" not in in_ns(router, "ipset", "list", "-n")
            assert in_ns(router, "ip", "-6", "route", "show", f"{B6}/128").strip() == ""
            assert in_ns(router, "cat", "/proc/sys/net/ipv6/conf/all/forwarding").strip() == "0"
            if mode == "bpf":
                for name in ("ipsets", "wep_sources", "routes"):
                    rows = dump_pinned(name, pin_dir)
                    assert rows, f"{name}: IPv4 entries expected"
                    assert not [r for r in rows if _holds_ipv6(r)], (name, rows)
            else:
                assert "cali60" not in in_ns(router, "ipset", "list", "-n")
                assert "cali40" in in_ns(router, "ipset", "list", "-n")
                chains6 = in_ns(router, BACKENDS6[mode].save, "-t", "filter")
                assert not re.search(r"^:cali-(fw|tw|pi|pri|pro|from|to)-", chains6, re.M)
                assert COMMENT_IPV6_DISABLED in chains6

            # an operator enables IPv6 forwarding and routes B by hand: still dropped
            in_ns(router, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
            in_ns(router, "ip", "-6", "route", "add", f"{B6}/128", "dev", "cali2")
            before = drops()

            def send() -> None:
                with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
                    for _ in range(5):
                        s.sendto(b"pyfelix", (B6, 7001))

            a_thread.call(send)
            _wait(lambda: drops() >= before + 5, "the IPv6 drops counted")
            assert not _connects(a_thread, B6, 8080)
            time.sleep(0.2)
            assert not sniffer.saw(A6, UDP, 7001)
            assert _connects(a_thread, B, 8080)
            assert not dp.loop.fatal.is_set()
    finally:
        for s in listeners:
            s.close()
        sniffer.close()
        a_thread.close()
        b_thread.close()


def _flush_conntrack(netns: str) -> None:
    """Delete every conntrack entry in `netns` (each gets its destroy event)."""
    from pyroute2 import NFCTSocket

    def flush() -> None:
        with NFCTSocket() as ct:
            ct.flush()

    thread = NetnsThread(netns)
    try:
        thread.call(flush)
    finally:
        thread.close()


def test_iptables_flow_logs_record_ipv6_and_ipv4_flows(make_netns, tmp_path) -> None:
    """iptables mode (nft) with flow logs: the ip6tables NFLOG rules and the reader opened
    in the router namespace (`netns=`) log IPv6 flows as IPv4 ones, with the rule that
    decided; an allowed IPv6 flow's end carries its packet count (conntrack accounting)."""
    import json

    router, a_ns, b_ns = _router_and_pods(make_netns)
    for state in ("time_wait", "close", "close_wait", "fin_wait", "last_ack"):
        in_ns(router, "sysctl", "-qw", f"net.netfilter.nf_conntrack_tcp_timeout_{state}=1")
    a_thread, b_thread = NetnsThread(a_ns), NetnsThread(b_ns)
    listeners: list[socket.socket] = []
    log_file = tmp_path / "flows.log"
    try:
        for family, ip in ((socket.AF_INET, B), (socket.AF_INET6, B6)):
            listeners += [_listen(b_thread, family, ip, port) for port in (8080, 9090)]
        dp = LinuxDataplane(netns=router, config=LinuxDataplaneConfig(
            iptables_backend="nft", flow_logs_directory=str(tmp_path),
            flow_logs_flush_interval=0.5))
        dp.start()
        try:
            for msg in _policed_pods():
                dp.enqueue(msg)
            assert dp.loop.in_sync.wait(15)
            _eventually(lambda: _connects(a_thread, B6, 8080), "IPv6 8080 never allowed")
            _eventually(lambda: _connects(a_thread, B, 8080), "IPv4 8080 never allowed")
            assert not _connects(a_thread, B6, 9090)

            def records() -> list[dict]:
                if not log_file.exists():
                    return []
                return [json.loads(x) for x in log_file.read_text().splitlines()]

            def seen() -> set[tuple]:
                return {(r["dest_ip"], r["dest_port"], r["action"], r["reporter"],
                         r["policies"]["all_policies"][0], bool(r["num_flows_completed"]))
                        for r in records() if r["source_ip"] in (A, A6)}

            want = {(B6, 8080, "allow", "dst", "0|default|web|allow|0", False),
                    (B, 8080, "allow", "dst", "0|default|web|allow|0", False),
                    (B6, 9090, "deny", "dst", "0|default|default.__TIER_END__|deny|-1", False),
                    (B6, 8080, "allow", "dst", "0|default|web|allow|0", True)}
            deadline = time.monotonic() + 60
            flush_at = time.monotonic() + 5
            while not want <= seen() and time.monotonic() < deadline:
                if flush_at and time.monotonic() > flush_at:
                    # the closed flow's entry expired after 1 s, but the kernel reaps idle
                    # expired entries (the destroy event the reader waits for) on its own
                    # schedule, which runs up to a minute with this few entries: delete the
                    # router's entries instead, the same destroy event with its counters
                    _flush_conntrack(router)
                    flush_at = 0.0
                time.sleep(0.2)
            assert want <= seen(), (want - seen(), seen())
            ended = [r for r in records() if r["dest_ip"] == B6 and r["num_flows_completed"]]
            assert all(r["flow_packets"] >= 6 and r["source_type"] == "wep"
                       and r["dest_name"] == "cali2" for r in ended), ended
            assert not dp.loop.fatal.is_set()
        finally:
            dp.stop()
    finally:
        for s in listeners:
            s.close()
        a_thread.close()
        b_thread.close()


# --- IPv6 NAT outgoing and IPv6 floating IPs -------------------------------------------------

ROUTER_EXT6, EXT6 = "fd00:ee::1", "fd00:ee::2"  # the router's uplink to an outside host


def _recording_listen(thread: NetnsThread, ip: str, port: int
                      ) -> tuple[socket.socket, list[str]]:
    """An IPv6 TCP server that answers "hello" and records each client's address."""
    peers: list[str] = []

    def make() -> socket.socket:
        srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((ip, port))
        srv.listen(8)
        return srv

    srv = thread.call(make)

    def serve() -> None:
        while True:
            try:
                conn, peer = srv.accept()
            except OSError:
                return
            peers.append(str(ipaddress.ip_address(peer[0])))
            with conn:
                conn.sendall(b"hello")

    threading.Thread(target=serve, daemon=True).start()
    return srv, peers


def _outside_host(router: str, ext_ns: str) -> None:
    """`ext_ns` on a veth to the router (ext0), fd00:ee::/64, with a route to A's floating
    IP through the router and NO route to the pods: only masqueraded traffic can return."""
    in_ns(router, "ip", "link", "add", "ext0", "type", "veth", "peer", "name", "eth0",
          "netns", f"/run/netns/{ext_ns}")
    in_ns(router, "ip", "-6", "addr", "add", f"{ROUTER_EXT6}/64", "dev", "ext0", "nodad")
    in_ns(router, "ip", "link", "set", "ext0", "up")
    in_ns(ext_ns, "ip", "-6", "addr", "add", f"{EXT6}/64", "dev", "eth0", "nodad")
    in_ns(ext_ns, "ip", "link", "set", "eth0", "up")
    in_ns(ext_ns, "ip", "link", "set", "lo", "up")
    in_ns(ext_ns, "ip", "-6", "route", "add", f"{FIP6}/128", "via", ROUTER_EXT6)


def _nat6_state(a_nat: tuple[str, ...], *, masquerade: bool) -> tuple[object, ...]:
    from pyfelix.agent.proto import IPAMPoolUpdate, NatInfo

    a = _ep("cali1", A, A6, (WEB,))
    a = WorkloadEndpointUpdate(a.id, dataclasses.replace(
        a.endpoint, ipv6_nat=tuple(NatInfo(ext, A6) for ext in a_nat)))
    return (IPAMPoolUpdate("pool4", "10.65.0.0/16", masquerade=False),
            IPAMPoolUpdate("pool6", "fd00:65::/64", masquerade=masquerade),
            IPSetUpdate("clients", "net", frozenset(
                {f"{B}/32", f"{B6}/128", f"{A6}/128", f"{FIP6}/128"})),
            OPEN, _web(None), a, _ep("cali2", B, B6), InSync())


@pytest.mark.parametrize("mode", ["nft", "bpf"])
def test_ipv6_nat_outgoing_and_floating_ip_in_ip6tables(make_netns, mode: str,
                                                        record_property) -> None:
    """IPv6 pool with natOutgoing: an outside host sees the router's address as the source
    of A's connection (and without natOutgoing, nothing: it has no route to the pods).
    A's IPv6 floating IP (FloatingIPs Enabled): ip6tables' cali-fip-dnat sends it to A,
    routed to A's veth; the policy is A's pod-IP policy (TCP 8080 from B, or from A or its
    floating IP): B reaches the floating IP on 8080 and A sees B's own address, B on
    9090 and the outside host on 8080 are denied, exactly as to A's pod address; A reaches
    its own floating IP (hairpin: cali-fip-snat), seen from the floating IP."""
    router, a_ns, b_ns = _router_and_pods(make_netns)
    ext_ns = make_netns()
    _outside_host(router, ext_ns)
    a_thread, b_thread, ext_thread = NetnsThread(a_ns), NetnsThread(b_ns), NetnsThread(ext_ns)
    servers: list[socket.socket] = []
    try:
        ext_srv, ext_peers = _recording_listen(ext_thread, EXT6, 8080)
        a_srv, a_peers = _recording_listen(a_thread, A6, 8080)
        servers += [ext_srv, a_srv, _listen(a_thread, socket.AF_INET6, A6, 9090)]
        with _dataplane(mode, router, floating_ips=True) as run:
            dp = run.dp
            for msg in _nat6_state((FIP6,), masquerade=True):
                dp.enqueue(msg)
            assert dp.loop.in_sync.wait(15)
            if mode == "bpf":
                for iface in ("cali1", "cali2"):
                    _wait(lambda i=iface: "pyfelix:calico_to_wep" in in_ns(
                        router, "tc", "filter", "show", "dev", i, "egress"),
                        f"our programs on {iface}")
            # what is programmed: ip6tables' nat table, the inet6 sets, the /128 route
            nat6 = _nat6_rules(router)
            assert re.search(rf"-A cali-fip-dnat -d {FIP6}/128 .*-j DNAT --to-destination "
                             rf"{A6}\b", nat6), nat6
            assert re.search(r"-A cali-nat-outgoing .*cali60masq-ipam-pools src.*"
                             r"cali60all-ipam-pools dst.*-j MASQUERADE", nat6), nat6
            masq_set = in_ns(router, "ipset", "list", "cali60masq-ipam-pools")
            assert "family inet6" in masq_set and "fd00:65::/64" in masq_set, masq_set
            assert "dev cali1" in in_ns(router, "ip", "-6", "route", "show", f"{FIP6}/128")

            # NAT outgoing: the outside host sees the router's uplink address
            t0 = time.monotonic()
            _eventually(lambda: _connects(a_thread, EXT6, 8080), "A never reached outside")
            record_property("first_masqueraded_ipv6_connection_s",
                            round(time.monotonic() - t0, 3))
            assert ext_peers and set(ext_peers) == {ROUTER_EXT6}, ext_peers

            # the floating IP gets A's pod-IP policy; A sees B's own address
            _eventually(lambda: _connects(b_thread, FIP6, 8080),
                        "B never reached A's floating IP on 8080")
            assert a_peers and set(a_peers) == {B6}, a_peers
            assert _connects(b_thread, A6, 8080)
            assert not _connects(b_thread, FIP6, 9090)
            assert not _connects(b_thread, A6, 9090)
            assert not _connects(ext_thread, FIP6, 8080)
            # A reaches its own floating IP: cali-fip-snat makes it arrive from FIP6, and the
            # answer finds its way back through both NATs. (The policy's set holds A6 and
            # FIP6: iptables mode polices in FORWARD, before the SNAT, so it sees A6, as
            # Felix's does; BPF polices at the veth, after it, and sees FIP6.)
            assert _connects(a_thread, FIP6, 8080)
            assert a_peers[-1] == FIP6, a_peers

            # natOutgoing off: the outside host's replies have no way back to A
            for msg in _nat6_state((FIP6,), masquerade=False):
                dp.enqueue(msg)
            _wait(lambda: "MASQUERADE" not in _nat6_rules(router),
                  "MASQUERADE never removed")
            assert not _connects(a_thread, EXT6, 8080)
            # the floating IP goes: its DNAT rule and route go with it
            for msg in _nat6_state((), masquerade=False):
                dp.enqueue(msg)
            _wait(lambda: FIP6 not in _nat6_rules(router),
                  "the floating IP's DNAT never removed")
            assert in_ns(router, "ip", "-6", "route", "show", f"{FIP6}/128").strip() == ""
            assert not _connects(b_thread, FIP6, 8080)
            assert _connects(b_thread, A6, 8080)
            assert not dp.loop.fatal.is_set()
    finally:
        for srv in servers:
            srv.close()
        for thread in (a_thread, b_thread, ext_thread):
            thread.close()
