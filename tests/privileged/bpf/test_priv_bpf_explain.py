"""The programs' support for explain and flow logs, on the real loaded programs
(BPF_PROG_TEST_RUN in a namespace of our own):

- a packet marked PF_MARK_TRACE records the deciding record in `verdict_trace` and counts
  nothing (rule, endpoint, global and denied-source counters, flow events; only the
  classifier's cost indicator classifier_steps) and creates no conntrack entry; the same
  packet unmarked does all of that;
- the flow-event budget: 20,000 denied packets in a burst send at most two one-second
  windows' worth of events; every packet is either sent or counted as dropped.
"""

from __future__ import annotations

import time

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import packets as pk
from pyfelix.agent.bpf.maps import denied_sources as denied_map
from pyfelix.agent.bpf.maps import rules as rules_map
from pyfelix.agent.bpf.maps import verdict_trace as trace_map
from pyfelix.agent.bpf.testrun import TC_ACT_OK, TC_ACT_SHOT, run_tc
from tests.privileged.bpf.bpf_harness import Harness
from tests.privileged.bpf.test_priv_bpf_policy import A, ingress_policy

pytestmark = pytest.mark.privileged

SCANNER, CLIENT = "10.65.7.7", "10.65.7.8"
FLOW_EVENTS_PER_SEC = 5000  # bpf/include/flow_events.h default


def _policy(h: Harness, *, flow_events: bool = True) -> None:
    h.state.config["flowlogsfileenabled"] = "true" if flow_events else "false"
    ingress_policy(h, p.Rule("deny", src_nets=(f"{SCANNER}/32",), rule_id="deny-scanner"),
                   p.Rule("allow", protocol=6, dst_ports=(p.PortRange(443, 443),),
                          rule_id="allow-https"))


def _run(h: Harness, pkt: bytes, mark: int = 0) -> int:
    fd = h.dp.prog_fd("calico_to_wep")
    return h.ns.call(run_tc, fd, pkt, ifindex=h.ifindexes["d1"], mark=mark).retval


def _trace(h: Harness) -> dict | None:
    raw = h.dp.maps["verdict_trace"].lookup(trace_map.KEY)
    return None if raw in (None, trace_map.EMPTY) else trace_map.decode_value(raw)


def _traffic_globals(h: Harness) -> dict[str, int]:
    """Global counters but classifier_steps, the classifier's cost indicator, which does
    count the steps of a traced packet's walk (it says how hard the classifier worked)."""
    return {k: v for k, v in h.globals().items() if k != "classifier_steps"}


def _denied(h: Harness) -> dict[tuple[int, str], int]:
    return {(r["counter_id"], r["source"]): r["packets"]
            for r in denied_map.dump(h.dp.maps["denied_sources"])}


def test_a_traced_packet_records_its_decision_and_counts_nothing(harness: Harness) -> None:
    h = harness
    _policy(h)
    h.dp.maps["conntrack"].clear()
    h.dp.maps["denied_sources"].clear()
    for src, port, allowed, rule in ((SCANNER, 443, False, "deny-scanner"),
                                     (CLIENT, 443, True, "allow-https"),
                                     (CLIENT, 22, False, "tier-end:default/ingress")):
        pkt = pk.tcp(src, A, 31000, port)
        counter_id = h.compiler.rule_ids.get(rule)
        before = (h.rule_counter(rule), _traffic_globals(h), _denied(h),
                  h.endpoint_counters("a"))
        h.dp.maps["verdict_trace"].update(trace_map.KEY, trace_map.EMPTY)
        assert _run(h, pkt, mark=trace_map.MARK_TRACE) == (TC_ACT_OK if allowed else TC_ACT_SHOT)
        trace = _trace(h)
        assert trace is not None
        assert (trace["allowed"], trace["counter_id"], trace["hook"]) == (allowed, counter_id, 1)
        assert trace["reason"] == "rule"  # the tier-end deny is a record too
        chain = h.dp.maps["rules"]
        record = rules_map.decode(chain.lookup(rules_map.encode_index(
            trace["chain_start"] + trace["record"])))
        assert record.counter_id == counter_id
        after = (h.rule_counter(rule), _traffic_globals(h), _denied(h),
                 h.endpoint_counters("a"))
        assert after == before, "a traced packet moved a counter"
        assert not h.dp.maps["conntrack"].items(), "a traced packet created a flow"
        # the same packet, not traced: counted (and, allowed, tracked)
        assert _run(h, pkt) == (TC_ACT_OK if allowed else TC_ACT_SHOT)
        assert h.rule_counter(rule)[0] == before[0][0] + 1
        assert h.globals()["flow_events"] + h.globals()["flow_events_dropped"] == (
            before[1]["flow_events"] + before[1]["flow_events_dropped"] + 1)
        if not allowed:
            assert _denied(h)[(counter_id, src)] == before[2].get((counter_id, src), 0) + 1
        assert bool(h.dp.maps["conntrack"].items()) == allowed
        h.dp.maps["conntrack"].clear()


def test_flow_events_are_rate_limited_and_the_rest_counted(harness: Harness) -> None:
    h = harness
    _policy(h)
    h.dp.maps["conntrack"].clear()
    before = h.globals()
    n = 20000
    out = h.run("to", pk.tcp(SCANNER, A, 31001, 443), "d1", repeat=n)
    assert out.retval == TC_ACT_SHOT
    after = h.globals()
    sent = after["flow_events"] - before["flow_events"]
    dropped = after["flow_events_dropped"] - before["flow_events_dropped"]
    assert sent + dropped == n
    assert 0 < sent <= 2 * FLOW_EVENTS_PER_SEC
    assert dropped >= n - 2 * FLOW_EVENTS_PER_SEC
    assert after["policy_denied"] - before["policy_denied"] == n  # every packet still denied


def test_no_flow_events_while_flow_logs_are_off(harness: Harness) -> None:
    h = harness
    _policy(h, flow_events=False)
    before = h.globals()
    assert h.run("to", pk.tcp(SCANNER, A, 31002, 443), "d1", repeat=100).retval == TC_ACT_SHOT
    after = h.globals()
    assert after["policy_denied"] - before["policy_denied"] == 100
    assert (after["flow_events"], after["flow_events_dropped"]) == (
        before["flow_events"], before["flow_events_dropped"])


def test_flow_events_carry_ipv4_and_ipv6_flows(harness: Harness) -> None:
    """The ring buffer's records as the agent reads them (BCC's ring buffer API, decoded by
    agent.bpf.maps.flow_events): an IPv6 flow's addresses and ports, as an IPv4 one's."""
    import ctypes

    from pyfelix.agent.bpf.maps import flow_events as events_map
    from tests.privileged.bpf.test_priv_bpf_ipv6 import A6, B6, endpoint_a

    h = harness
    h.state.config["flowlogsfileenabled"] = "true"
    h.apply(p.ActivePolicyUpdate(p.PolicyID("default", "pol"), p.Policy(inbound_rules=(
                p.Rule("allow", protocol=6, dst_ports=(p.PortRange(443, 443),),
                       rule_id="allow-https"),))),
            endpoint_a(h, tiers=(p.TierInfo("default", ingress_policies=("pol",)),)))
    h.dp.maps["conntrack"].clear()
    events: list[dict] = []

    def on_event(_ctx: object, data: object, size: int) -> int:
        events.append(events_map.decode(ctypes.string_at(data, min(size, events_map.SIZE))))
        return 0

    h.dp.bpf[b"flow_events"].open_ring_buffer(on_event)
    h.dp.bpf.ring_buffer_consume()  # the earlier tests' events (a full buffer sends none)
    events.clear()
    time.sleep(1.1)  # a new one-second window of the in-kernel event budget
    assert _run(h, pk.tcp6(B6, A6, 41234, 443)) == TC_ACT_OK
    assert _run(h, pk.tcp6(B6, A6, 41235, 22)) == TC_ACT_SHOT
    assert _run(h, pk.tcp("10.65.0.2", A, 41236, 443)) == TC_ACT_OK
    h.dp.bpf.ring_buffer_consume()
    ours = [(e["family"], e["src"], e["dst"], e["sport"], e["dport"], e["proto"], e["allowed"],
             e["hook"], e["counter_id"] == h.compiler.rule_ids.get("allow-https"))
            for e in events if e["sport"] in (41234, 41235, 41236)]
    assert ours == [(6, B6, A6, 41234, 443, 6, True, 1, True),
                    (6, B6, A6, 41235, 22, 6, False, 1, False),
                    (4, "10.65.0.2", A, 41236, 443, 6, True, 1, True)]
