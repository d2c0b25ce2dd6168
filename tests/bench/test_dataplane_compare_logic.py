"""dataplane-compare's figures from measured points (the lab part is faked here; the
privileged smoke test in tests/bench_bpf runs it for real): keys per dataplane and rule
count, ratios, and a failed point reported as a note with no figure."""

from __future__ import annotations

import pytest

from pyfelix.agent.inputs.limits import LIMITS
from pyfelix.agent.model import parse_resource
from pyfelix.bench import dataplane_compare
from pyfelix.bench.dataplane_compare import ComparePlan, PointResult, compare, policy_documents
from pyfelix.bench.registry import BenchContext, BenchSettings


def test_policy_documents_hold_n_never_matching_rules_then_the_client_allow():
    docs = policy_documents(10_000)
    assert [d["spec"]["order"] for d in docs] == [1, 2, 3, 4]  # 2,500 rules each, in order
    assert all(d["spec"]["selector"] == "role == 'server'" for d in docs)
    ingress = [rule for d in docs for rule in d["spec"]["ingress"]]
    assert len(ingress) == 10_001
    assert max(len(d["spec"]["ingress"]) for d in docs) <= LIMITS.max_rules_per_policy
    nets = {rule["source"]["nets"][0] for rule in ingress[:-1]}
    assert len(nets) == 10_000  # all distinct /32s
    assert all(not net.startswith("10.65.") for net in nets)  # never a lab pod address
    assert ingress[-1] == {"action": "Allow", "source": {"selector": "role == 'client'"}}
    (small,) = policy_documents(1000)
    assert len(small["spec"]["ingress"]) == 1001
    assert small["metadata"]["name"] == docs[0]["metadata"]["name"]  # replaced in place


def test_policy_documents_are_accepted_by_the_model():
    for doc in policy_documents(10_000):
        policy = parse_resource(doc)
        assert len(policy.ingress) == len(doc["spec"]["ingress"])


def test_figures_ratios_and_a_failed_point(monkeypatch):
    measured = {
        "bpf": {0: PointResult([900.0, 1000.0, 1100.0], 0, 10.0, 20.0, 10.0),
                1000: PointResult([2000.0], 0, 11.0, 22.0, 9.5),
                10_000: PointResult(failed="policy with 10000 rules not enforced as written")},
        "iptables": {0: PointResult([1000.0], 0, 10.0, 21.0, 10.0),
                     1000: PointResult([500.0], 3, 30.0, 60.0, 9.0),
                     10_000: PointResult([50.0], 0, 90.0, 200.0, 8.0)},
    }
    monkeypatch.setattr(dataplane_compare, "measure_dataplane",
                        lambda dp, plan: measured[dp])
    ctx = BenchContext(BenchSettings())
    f = compare(ComparePlan(), ctx)
    assert f["rules_0"] == 0 and f["rules_10000"] == 10_000
    assert f["bpf_new_conn_per_s_0"] == 1000.0
    assert (f["bpf_new_conn_per_s_0_min"], f["bpf_new_conn_per_s_0_max"]) == (900.0, 1100.0)
    assert f["bpf_over_iptables_new_conn_rate_1000"] == pytest.approx(4.0)
    assert f["iptables_new_conn_errors_1000"] == 3
    assert f["bpf_throughput_1000_over_0"] == pytest.approx(0.95)
    # the failed point: a note with the reason, and no figure made up for it
    assert not any(k.startswith("bpf_") and k.endswith("_10000") for k in f)
    assert "bpf_over_iptables_new_conn_rate_10000" not in f
    assert "bpf_throughput_10000_over_0" not in f
    assert f["iptables_new_conn_per_s_10000"] == 50.0
    assert ctx.notes == {"bpf_10000": "FAILED: policy with 10000 rules not enforced as written"}


def test_quick_plan_is_tiny():
    plan = ComparePlan.quick()
    assert plan.rule_counts == (0, 100) and plan.samples == 1
    assert plan.sample_seconds == plan.tool_seconds == 1
