"""The real tc programs (BPF_PROG_TEST_RUN) on a sample of the classifier property test's
random cases (tests/bpf/test_bpf_classifier.py): for each random policy set and packet, the
kernel's verdict at both hooks equals Calico's semantics (expected_verdict) and the Python
mirror of the program (classifier.decide over the same encoded maps).

Packets of both families (the sets hold members of both). The endpoint may send from any
source (allowSpoofedSourcePrefixes 0.0.0.0/0 and ::/0), so the
random source addresses reach policy at calico_from_wep; conntrack is cleared before every
packet, so every packet is a first packet.
"""

from __future__ import annotations

import random
import struct

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import classifier as cls
from pyfelix.agent.bpf import packets as pk
from tests.bpf.bpf_reference import Pkt, expected_verdict
from tests.bpf.test_bpf_classifier import (
    SETS,
    WID,
    classifier_packet,
    contents,
    random_packet,
    random_rule,
)
from tests.privileged.bpf.bpf_harness import Harness

pytestmark = pytest.mark.privileged


def frame(pkt: Pkt) -> bytes:
    if pkt.family == 6:
        if pkt.proto == 6:
            return pk.tcp6(pkt.src, pkt.dst, pkt.sport, pkt.dport)
        if pkt.proto in (17, 132):  # UDP and SCTP both start with the two ports
            return pk.ipv6(pkt.src, pkt.dst, pkt.proto,
                           struct.pack("!HHHH", pkt.sport, pkt.dport, 16, 0) + bytes(8))
        if pkt.proto == 58:
            return pk.icmp6(pkt.src, pkt.dst, pkt.icmp_type, pkt.icmp_code)
        return pk.ipv6(pkt.src, pkt.dst, pkt.proto, bytes(8))
    if pkt.proto == 6:
        return pk.tcp(pkt.src, pkt.dst, pkt.sport, pkt.dport)
    if pkt.proto == 17:
        return pk.udp(pkt.src, pkt.dst, pkt.sport, pkt.dport)
    if pkt.proto == 132:
        return pk.sctp(pkt.src, pkt.dst, pkt.sport, pkt.dport)
    if pkt.proto == 1:
        return pk.icmp(pkt.src, pkt.dst, pkt.icmp_type, pkt.icmp_code)
    return pk.ipv4(pkt.src, pkt.dst, pkt.proto, bytes(8))


def program(h: Harness, rng: random.Random) -> p.WorkloadEndpoint:
    msgs: list[object] = [p.IPSetUpdate(n, t, m) for n, (t, m) in SETS.items()]
    tiers = []
    for t in range(rng.randint(0, 3)):
        names = []
        for i in range(rng.randint(0, 2)):
            name = f"t{t}p{i}"
            msgs.append(p.ActivePolicyUpdate(p.PolicyID(f"t{t}", name), p.Policy(
                inbound_rules=tuple(random_rule(rng) for _ in range(rng.randint(0, 6))),
                outbound_rules=tuple(random_rule(rng) for _ in range(rng.randint(0, 6))))))
            names.append(name)
        tiers.append(p.TierInfo(f"t{t}", ingress_policies=tuple(names),
                                egress_policies=tuple(rng.sample(names, len(names))),
                                default_action=rng.choice(["deny", "pass"])))
    profiles = []
    for i in range(rng.randint(0, 2)):
        msgs.append(p.ActiveProfileUpdate(f"prof{i}", p.Profile(
            inbound_rules=tuple(random_rule(rng) for _ in range(rng.randint(0, 3))),
            outbound_rules=tuple(random_rule(rng) for _ in range(rng.randint(0, 3))))))
        profiles.append(f"prof{i}")
    update = h.endpoint("a", "d1", tiers=tuple(tiers), profiles=tuple(profiles),
                        allow_spoofed=("0.0.0.0/0", "::/0"))
    assert update.id == WID
    msgs.append(update)
    out = h.apply(*msgs)
    assert out.problems == []
    return update.endpoint


def test_kernel_classifier_verdicts_equal_the_reference_on_random_cases(harness):
    h = harness
    rng = random.Random(20261202)
    cases = 0
    for _ in range(30):
        ep = program(h, rng)
        out = h.last
        assert out is not None
        m = contents(out)
        prog = out.programs[WID]
        for _ in range(12):
            pkt = random_packet(rng)
            for direction, hook, ref in (("ingress", "to", prog.ingress),
                                         ("egress", "from", prog.egress)):
                want = expected_verdict(h.state, ep, direction, pkt)
                mirror, _ = cls.decide(m, ref.start, ref.length, classifier_packet(pkt))
                h.dp.maps["conntrack"].clear()
                got = h.verdict(hook, frame(pkt), "d1")
                assert (got, mirror) == (want, want), (direction, pkt)
                cases += 1
    assert cases >= 700
    counters = h.globals()
    assert counters["classifier_error"] == 0 and counters["tail_call_failed"] == 0
