"""The per-policy and denied metrics collector (agent.dataplane.managers.bpf_metrics) over
fake sources: Felix's label format, sums per label set, the policy-series cap."""

from __future__ import annotations

from pyfelix.agent.dataplane.managers import bpf_metrics
from pyfelix.agent.dataplane.managers.bpf_metrics import (
    PolicyCounterCollector,
    felix_policy_label,
)
from pyfelix.agent.proto import RuleMeta


def _samples(collector: PolicyCounterCollector) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in collector.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_felix_policy_labels() -> None:
    assert felix_policy_label(RuleMeta("policy", "default", "ns/p", "ingress", 2, "deny")) \
        == "default|ns/p|2|deny"
    assert felix_policy_label(RuleMeta("profile", "", "kns.x", "egress", 0, "deny")) \
        == "__PROFILE__|kns.x|0|deny"
    assert felix_policy_label(RuleMeta("tier-end", "t1", "", "ingress", -1, "deny")) \
        == "t1|__TIER_END__|-1|deny"
    assert felix_policy_label(RuleMeta("default-deny", "", "", "egress", -1, "deny")) \
        == "__DEFAULT__|__DENY__|-1|deny"


def test_denied_by_rule_and_source_and_per_policy_sums() -> None:
    deny = RuleMeta("policy", "default", "deny-x", "ingress", 0, "deny")
    allow0 = RuleMeta("policy", "default", "web", "ingress", 0, "allow")
    allow1 = RuleMeta("policy", "default", "web", "egress", 3, "allow")
    c = PolicyCounterCollector()
    assert _samples(c) == {}  # no sources: nothing exported
    c.set_sources(rules=lambda: [(deny, 4, 400), (allow0, 2, 120), (allow1, 5, 300)],
                  denied=lambda: [(deny, "10.0.0.1", 3, 300), (deny, "10.0.0.2", 1, 100)])
    got = _samples(c)
    label = "default|deny-x|0|deny"
    assert got[("calico_denied_packets", (("policy", label), ("srcIP", "10.0.0.1")))] == 3
    assert got[("calico_denied_bytes", (("policy", label), ("srcIP", "10.0.0.2")))] == 100
    key = (("action", "allow"), ("policy", "web"), ("tier", "default"))
    assert got[("pyfelix_policy_packets_total", key)] == 7
    assert got[("pyfelix_policy_bytes_total", key)] == 420
    c.forget(object())  # another owner: still set
    assert _samples(c)
    owner = object()
    c.set_sources(rules=lambda: [], denied=lambda: [], owner=owner)
    c.forget(owner)
    assert _samples(c) == {}


def test_policy_series_are_capped(monkeypatch) -> None:
    monkeypatch.setattr(bpf_metrics, "MAX_POLICY_SERIES", 3)
    metas = [RuleMeta("policy", "default", f"p{i:02d}", "ingress", 0, "allow") for i in range(10)]
    c = PolicyCounterCollector()
    c.set_sources(rules=lambda: [(m, 1, 10) for m in metas], denied=None)
    got = _samples(c)
    policies = {dict(k)["policy"] for (name, k) in got if name == "pyfelix_policy_packets_total"}
    assert policies == {"p00", "p01", "p02", "__other__"}
    other = (("action", "allow"), ("policy", "__other__"), ("tier", ""))
    assert got[("pyfelix_policy_packets_total", other)] == 7
