"""iptables-mode flow logs without a kernel: the NFLOG rules the renderer adds (walked by
PacketWalker: the verdict is unchanged and the one NFLOG record of the decision names the
rule that decided it), NFLOG prefixes, the nfnetlink_log decoder on crafted messages, and
the reader's budget and drop accounting over a fake socket."""

from __future__ import annotations

import ipaddress
import json
import socket
import struct
from pathlib import Path

import pytest

from pyfelix.agent import proto
from pyfelix.agent.dataplane.iptables import nflog
from pyfelix.agent.dataplane.managers.flow_logs import NflogFlowLogManager
from pyfelix.agent.proto import (
    ActivePolicyUpdate,
    ActiveProfileUpdate,
    Policy,
    PolicyID,
    Profile,
    Rule,
    RuleMeta,
    TierInfo,
)
from pyfelix.agent.shims import nflog as nflog_socket
from pyfelix.agent.shims import nfnetlink
from tests.dataplane.dp_harness import Harness, endpoint
from tests.dataplane.test_dp_iptables_render import A_IP, B_IP, FIELD_CASES, OPEN, SETS, P


def _harness(*msgs: object) -> Harness:
    h = Harness(flow_logs=True)
    h.sync([*SETS, OPEN, *msgs])
    return h


def _ingress_decision(h: Harness, **packet: object) -> tuple[str, list[tuple[int, str]]]:
    """(verdict, the NFLOG records of calib's ingress decision) of one forwarded packet."""
    h.walker.nflogged.clear()
    verdict = h.forward("calia", "calib", **{"src": A_IP, "dst": B_IP, **packet})
    return verdict, [(g, p) for g, p, _ in h.walker.nflogged if p[1] == "I"]


@pytest.mark.parametrize("case", sorted(FIELD_CASES))
def test_every_field_case_logs_its_decision_once_with_the_deciding_rule(case: str) -> None:
    rule, cases = FIELD_CASES[case]
    h = _harness(ActivePolicyUpdate(PolicyID("default", "p"), Policy(inbound_rules=(rule,))),
                 endpoint("calia", A_IP, profiles=["open"]),
                 endpoint("calib", B_IP, profiles=["open"],
                          tiers=[TierInfo("default", ingress_policies=("p",))]))
    decoder = nflog.PrefixDecoder()
    for packet, expected in cases:
        verdict, records = _ingress_decision(h, **packet)
        assert verdict == expected, packet
        [(group, prefix)] = records
        decided = decoder.decode(prefix)
        assert decided is not None, prefix
        if verdict == "ACCEPT":
            assert group == nflog.GROUP_ALLOW and decided == RuleMeta(
                "policy", "default", "p", "ingress", 0, "allow"), (packet, prefix)
        else:  # the one rule did not match (or denied): the tier's end decided
            assert group == nflog.GROUP_DENY, (packet, prefix)
            assert decided.action == "deny" and decided.kind in ("tier-end", "policy")
    # the sender's egress (profile "open") was logged as an allow of the profile's rule 0
    egress = [nflog.PrefixDecoder().decode(p) for g, p, _ in h.walker.nflogged if p[1] == "O"]
    assert egress and all(r == RuleMeta("profile", "", "open", "egress", 0, "allow")
                          for r in egress)


def test_deny_rule_tier_end_profiles_and_default_deny_are_named() -> None:
    deny_udp = ActiveProfileUpdate("deny-udp", Profile(inbound_rules=(
        Rule(action="deny", protocol=17),)))
    h = _harness(
        deny_udp,
        ActivePolicyUpdate(PolicyID("t1", "p1"), Policy(inbound_rules=(
            Rule(action="deny", protocol=6, dst_ports=P(22)),
            Rule(action="pass", protocol=17),
            Rule(action="allow", protocol=6, src_nets=("10.65.0.1/32", "10.70.0.0/16"),
                 dst_ports=P(80))))),
        endpoint("calia", A_IP, profiles=["open"]),
        endpoint("calib", B_IP, profiles=["deny-udp", "open"],
                 tiers=[TierInfo("t1", ingress_policies=("p1",))]),
        endpoint("calic", "10.65.0.3"))
    d = nflog.PrefixDecoder()
    cases = [({"dport": 22}, "DROP", RuleMeta("policy", "t1", "p1", "ingress", 0, "deny")),
             ({"dport": 80}, "ACCEPT",
              RuleMeta("policy", "t1", "p1", "ingress", 2, "allow")),  # marks path
             ({"dport": 81}, "DROP", RuleMeta("tier-end", "t1", "", "ingress", -1, "deny")),
             ({"proto": 17}, "DROP",
              RuleMeta("profile", "", "deny-udp", "ingress", 0, "deny"))]
    for packet, verdict, rule in cases:
        got, records = _ingress_decision(h, **packet)
        assert got == verdict and [d.decode(p) for _, p in records] == [rule], (packet, records)
    h.walker.nflogged.clear()
    assert h.forward("calia", "calic", src=A_IP, dst="10.65.0.3") == "DROP"
    assert [d.decode(p) for _, p, _ in h.walker.nflogged if p[1] == "I"] == [
        RuleMeta("default-deny", "", "", "ingress", -1, "deny")]
    # established packets never reach policy: nothing logged
    assert _ingress_decision(h, dport=80, ctstate="ESTABLISHED") == ("ACCEPT", [])


def test_flow_logs_off_renders_no_nflog() -> None:
    h = Harness()
    h.sync([OPEN, ActivePolicyUpdate(PolicyID("default", "p"), Policy(inbound_rules=(
        Rule(action="deny"),))), endpoint("calia", A_IP, profiles=["open"]),
        endpoint("calib", B_IP, tiers=[TierInfo("default", ingress_policies=("p",))])])
    assert h.forward("calia", "calib", src=A_IP, dst=B_IP) == "DROP"
    assert h.walker.nflogged == []


def test_long_names_are_hashed_within_nflog_limit_and_resolved_once_learnt() -> None:
    long_name = "a-very-long-policy-name-" * 4
    text = nflog.prefix("allow", False, "policy", 12, "security", long_name)
    assert len(text.encode()) <= nflog.MAX_PREFIX and text.startswith("AOP12|#")
    d = nflog.PrefixDecoder()
    assert d.decode(text) is None  # unknown hash: not ours (counted as malformed)
    d.learn("security", long_name)
    assert d.decode(text) == RuleMeta("policy", "security", long_name, "egress", 12,
                                            "allow")
    for foreign in ("", "calico-packet: ", "DXP|a|b", "AIPx|t|p", "ZIP0|t|p"):
        assert d.decode(foreign) is None, foreign


def _nlmsg(payload: bytes, prefix: bytes = b"DIP0|default|p\0", group: int = 1) -> bytes:
    attrs = b""
    for kind, data in ((nflog_socket.NFULA_PREFIX, prefix),
                       (nflog_socket.NFULA_PAYLOAD, payload)):
        a = struct.pack("=HH", 4 + len(data), kind) + data
        attrs += a + b"\0" * (-len(a) % 4)
    body = struct.pack("!BBH", socket.AF_INET, 0, group) + attrs
    return struct.pack("=IHHII", 16 + len(body), nflog_socket.NFNL_SUBSYS_ULOG << 8, 0, 0,
                       0) + body


def _ipv4(proto_num: int, l4: bytes, src: str = "10.65.0.3", dst: str = "10.65.0.1") -> bytes:
    total = 20 + len(l4) + 100  # the copy is truncated: the length comes from the header
    return (struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0, 64, proto_num, 0,
                        socket.inet_aton(src), socket.inet_aton(dst)) + l4)


def test_nflog_messages_decode_ipv4_ipv6_icmp_and_count_garbage() -> None:
    tcp = _nlmsg(_ipv4(6, struct.pack("!HH", 40001, 443) + b"\0" * 16))
    echo = _nlmsg(_ipv4(1, struct.pack("!BBHHH", 8, 0, 0, 77, 1)), b"AOR0||open\0", group=2)
    v6 = _nlmsg(struct.pack("!IHBB", 0x60000000, 12, 17, 64)
                + ipaddress.IPv6Address("fd00::3").packed
                + ipaddress.IPv6Address("fd00::1").packed + struct.pack("!HHHH", 5353, 53, 12,
                                                                        0))
    garbage = _nlmsg(b"\x10\x00")
    packets, malformed = nflog_socket.parse_messages(tcp + echo + v6 + garbage)
    assert malformed == 1
    assert packets == [
        nflog_socket.NflogPacket(1, "DIP0|default|p", 4, "10.65.0.3", "10.65.0.1", 6, 40001,
                                 443, 140),
        nflog_socket.NflogPacket(2, "AOR0||open", 4, "10.65.0.3", "10.65.0.1", 1, 77, 0, 128),
        nflog_socket.NflogPacket(1, "DIP0|default|p", 6, "fd00::3", "fd00::1", 17, 5353, 53,
                                 52)]
    # a truncated trailing message stops the parse, counted
    assert nflog_socket.parse_messages(tcp[:-8]) == ([], 1)


def test_netlink_drops_column_is_read_for_our_inode(tmp_path: Path) -> None:
    proc = tmp_path / "netlink"
    proc.write_text("sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    "
                    "Drops    Inode\n"
                    "0000000000000000 12  1234       00000000 0        0        0     2        "
                    "17       99\n"
                    "0000000000000000 0   1          00000000 0        0        0     2        "
                    "3        100\n")
    assert nfnetlink.netlink_socket_drops(99, str(proc)) == 17
    assert nfnetlink.netlink_socket_drops(5, str(proc)) == 0


class _FakeSocket:
    """Always readable; each read returns one message of `packet`."""

    def __init__(self, packet: nflog_socket.NflogPacket) -> None:
        self.packet = packet
        self.reads = 0
        self.r, self.w = socket.socketpair()
        self.w.send(b"x")  # keeps select() saying readable

    def fileno(self) -> int:
        return self.r.fileno()

    def read(self) -> tuple[list[nflog_socket.NflogPacket], int]:
        self.reads += 1
        return [self.packet], 0


def test_reader_takes_its_budget_per_second_and_counts_kernel_drops(tmp_path: Path) -> None:
    now = [0.0]
    m = NflogFlowLogManager(directory=str(tmp_path), flush_interval=1.0, max_bytes=1 << 20,
                            max_files=1, max_events_per_sec=300, clock=lambda: now[0])
    m.on_update(proto.WorkloadEndpointUpdate(
        proto.WorkloadEndpointID("k8s", "prod/api", "eth0"),
        proto.WorkloadEndpoint(state="active", name="cali1", ipv4_nets=("10.65.0.1/32",))))
    sock = _FakeSocket(nflog_socket.NflogPacket(1, "DIP0|default|p", 4, "10.65.0.3",
                                                "10.65.0.1", 6, 40001, 443, 60))
    drops = iter([50, 120, 120, 120, 120])

    def tick(_timeout: float) -> bool:  # the reader's wait: one simulated second passes
        now[0] += 1.0
        if now[0] >= 3.0:
            m._stop.set()
        return m._stop.is_set()

    m._stop.wait = tick  # type: ignore[method-assign]
    m._read_loop(sock, lambda: next(drops))
    assert sock.reads == 900  # 300 a second for three seconds, never more
    assert m.dropped == 120
    records = [json.loads(x) for x in (tmp_path / "flows.log").read_text().splitlines()]
    assert {(r["dest_name"], r["action"], r["reporter"], tuple(r["policies"]["all_policies"]))
            for r in records} == {("api", "deny", "dst", ("0|default|p|deny|0",))}
    assert sum(r["policy_packets"] for r in records) == 900


def _nla(kind: int, data: bytes, nested: bool = False) -> bytes:
    a = struct.pack("=HH", 4 + len(data), kind | (0x8000 if nested else 0)) + data
    return a + b"\0" * (-len(a) % 4)


def _ct_delete(src: str, dst: str, proto_num: int, sport: int, dport: int,
               orig: tuple[int, int] | None, reply: tuple[int, int] | None) -> bytes:
    from pyfelix.agent.shims import conntrack_events as ce

    ip = _nla(ce.CTA_IP_V4_SRC, socket.inet_aton(src)) + _nla(ce.CTA_IP_V4_DST,
                                                               socket.inet_aton(dst))
    if proto_num == 1:
        l4 = _nla(ce.CTA_PROTO_NUM, bytes([1])) + _nla(ce.CTA_PROTO_ICMP_ID,
                                                       struct.pack("!H", sport))
    else:
        l4 = (_nla(ce.CTA_PROTO_NUM, bytes([proto_num]))
              + _nla(ce.CTA_PROTO_SRC_PORT, struct.pack("!H", sport))
              + _nla(ce.CTA_PROTO_DST_PORT, struct.pack("!H", dport)))
    body = _nla(ce.CTA_TUPLE_ORIG, _nla(ce.CTA_TUPLE_IP, ip, True)
                + _nla(ce.CTA_TUPLE_PROTO, l4, True), True)
    for kind, counts in ((ce.CTA_COUNTERS_ORIG, orig), (ce.CTA_COUNTERS_REPLY, reply)):
        if counts is not None:
            body += _nla(kind, _nla(ce.CTA_COUNTERS_PACKETS, struct.pack("!Q", counts[0]))
                         + _nla(ce.CTA_COUNTERS_BYTES, struct.pack("!Q", counts[1])), True)
    body = struct.pack("!BBH", socket.AF_INET, 0, 0) + body
    return struct.pack("=IHHII", 16 + len(body),
                       (ce.NFNL_SUBSYS_CTNETLINK << 8) | ce.IPCTNL_MSG_CT_DELETE, 0, 0,
                       0) + body


def test_conntrack_destroy_events_decode_with_both_directions_counted() -> None:
    from pyfelix.agent.shims.conntrack_events import FlowEnd, parse_messages

    data = (_ct_delete("10.65.0.2", "10.65.0.1", 6, 40001, 443, (6, 400), (5, 3000))
            + _ct_delete("10.65.0.2", "10.65.0.1", 1, 77, 0, None, None)
            + _nlmsg(b"", group=1))  # another subsystem's message: ignored
    assert parse_messages(data) == ([
        FlowEnd("10.65.0.2", "10.65.0.1", 6, 40001, 443, 11, 3400),
        FlowEnd("10.65.0.2", "10.65.0.1", 1, 77, 0, 0, 0)], 0)


def test_flows_an_allow_started_end_with_its_rule_and_counts(tmp_path: Path) -> None:
    from pyfelix.agent.shims.conntrack_events import FlowEnd

    m = NflogFlowLogManager(directory=str(tmp_path), flush_interval=1.0, max_bytes=1 << 20,
                            max_files=1)
    for prefix in ("AIP0|default|allow-https", "AOR0||kns.prod"):  # ingress and egress
        assert m.add_packet(nflog_socket.NflogPacket(2, prefix, 4, "10.65.0.2", "10.65.0.1",
                                                     6, 40001, 443, 60))
    m.flush()
    assert m.end_flow(FlowEnd("10.65.0.2", "10.65.0.1", 6, 40001, 443, 11, 3400))
    assert not m.end_flow(FlowEnd("10.65.0.2", "10.65.0.1", 6, 40001, 443, 11, 3400))  # once
    assert not m.end_flow(FlowEnd("10.65.0.9", "10.65.0.1", 6, 1, 443, 1, 60))  # not ours
    m.flush()
    lines = [json.loads(x) for x in (tmp_path / "flows.log").read_text().splitlines()]
    ends = sorted((r for r in lines if r["num_flows_completed"]), key=lambda r: r["reporter"])
    assert [(r["reporter"], r["policies"]["all_policies"][0], r["num_flows_started"],
             r["flow_packets"], r["flow_bytes"]) for r in ends] == [
        ("dst", "0|default|allow-https|allow|0", 0, 11, 3400),
        ("src", "0|__PROFILE__|kns.prod|allow|0", 0, 11, 3400)]


def test_the_started_flows_memory_is_bounded(tmp_path: Path) -> None:
    m = NflogFlowLogManager(directory=str(tmp_path), flush_interval=1.0, max_bytes=1 << 20,
                            max_files=1)
    m.MAX_STARTED = 10
    for sport in range(25):
        m.add_packet(nflog_socket.NflogPacket(2, "AIP0|default|p", 4, "10.65.0.2",
                                              "10.65.0.1", 6, sport, 443, 60))
    assert len(m._started) == 10 and min(k[2] for k in m._started) == 15
