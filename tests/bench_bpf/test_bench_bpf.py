"""The BPF benchmarks end to end (`make test-bench`, outside `make test`): each runs in quick
mode (privileged) and reports every figure it documents, with values that hang together.
No speed target is asserted here: targets live in the benchmarks' reports. That they are
registered and import is checked in `make test` (tests/bench/test_bench_framework.py)."""

from __future__ import annotations

import os
from contextlib import ExitStack

import pytest

from pyfelix.bench import BenchSettings, run


def quick(name: str) -> dict[str, float]:
    results = run([name], BenchSettings.quick())
    assert not results.errors, results.errors
    return results.figures[name]


def _bench_pins() -> set[str]:
    return {n for n in os.listdir("/sys/fs/bpf") if n.startswith("pyfelix-bench-")}


@pytest.fixture
def leaves_nothing():
    """No pin directory of a benchmark is left behind (lab-based benchmarks' namespaces and
    pins are the lab teardown's, checked by the lab's own tests)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    before = _bench_pins()
    yield
    assert _bench_pins() - before == set()


@pytest.mark.privileged
def test_bpf_verdict_figures(leaves_nothing):
    f = quick("bpf-verdict")
    for n in (1, 10, 100, 1000, 10000):
        assert f[f"first_packet_ns_{n}_min"] <= f[f"first_packet_ns_{n}"] \
            <= f[f"first_packet_ns_{n}_max"]
    assert 0 < f["ct_hit_ns"] < f["first_packet_ns_1000"]
    # the do-nothing program costs less than any real verdict (it is part of each of them)
    assert 0 < f["harness_ns"] < f["ct_hit_ns"]
    assert f["first_packet_10000_over_10"] == pytest.approx(
        f["first_packet_ns_10000"] / f["first_packet_ns_10"])
    assert f["first_packet_1000_over_ct_hit"] == pytest.approx(
        f["first_packet_ns_1000"] / f["ct_hit_ns"])
    # IPv6 beside IPv4: real runs of the programs, dearer than the harness alone
    for name in ("ct_hit_v6_ns", "ct_hit_from_wep_v6_ns",
                 *(f"first_packet_v6_ns_{n}" for n in (1, 10, 100, 1000, 10000))):
        assert f[f"{name}_min"] <= f[name] <= f[f"{name}_max"], name
        assert f[name] > f["harness_ns"], name
    assert f["trie_members"] == 100_000


@pytest.mark.privileged
def test_services_figures(leaves_nothing, tmp_path):
    """Both parts of the services benchmark, kept short: the first-packet figures in quick
    mode, and the connection rate through a ClusterIP with 10 Services on both dataplanes
    (the full benchmark repeats that for 1,000 and 10,000)."""
    from pyfelix.bench.registry import BenchContext
    from pyfelix.bench.services import build_conn_rate, first_packet_figures, start_conn_lab

    f = first_packet_figures(BenchContext(BenchSettings.quick()))
    for n in (10, 1000, 10000):
        assert f[f"bpf_first_packet_ns_{n}_min"] <= f[f"bpf_first_packet_ns_{n}"] \
            <= f[f"bpf_first_packet_ns_{n}_max"]
        # a first packet through the NAT costs more than the do-nothing program
        assert f[f"bpf_first_packet_ns_{n}"] > f["bpf_first_packet_harness_ns"] > 0
    assert f["bpf_first_packet_ratio_10000_to_10"] == pytest.approx(
        f["bpf_first_packet_ns_10000"] / f["bpf_first_packet_ns_10"], rel=0.01)
    # the diagnostic: 10,000 Services, packets to the same 10 ClusterIPs
    assert f["bpf_first_packet_ns_10000_hot10"] > f["bpf_first_packet_harness_ns"]
    assert f["bpf_first_packet_ratio_10000_hot10_to_10"] == pytest.approx(
        f["bpf_first_packet_ns_10000_hot10"] / f["bpf_first_packet_ns_10"], rel=0.01)
    binary = build_conn_rate(str(tmp_path))
    with ExitStack() as stack:  # both labs at once, as the benchmark runs them
        labs = {dp: start_conn_lab(stack, dp, 10, binary) for dp in ("bpf", "iptables")}
        for dataplane, rate in labs.items():
            assert rate(0.3) > 0, dataplane


@pytest.mark.privileged
def test_map_sync_figures(leaves_nothing):
    f = quick("map-sync")
    assert f["members"] == 100_000
    assert f["seconds_100k_members"] > f["seconds_noop_apply"] > 0
    assert f["seconds_1k_delta"] > 0 and f["seconds_100k_removal"] > 0


@pytest.mark.privileged
def test_policy_latency_figures(leaves_nothing):
    f = quick("policy-latency")
    assert f["endpoints"] == 1000 and f["samples"] == 10
    assert 0 < f["p50_ms"] <= f["p99_ms"] <= f["max_ms"]
    assert 0 < f["label_p50_ms"] <= f["label_p99_ms"]
    assert 0 < f["apply_p50_ms"] <= f["apply_p99_ms"]


@pytest.mark.privileged
def test_dataplane_compare_figures(leaves_nothing):
    """The C-tool path end to end at tiny scale (no policy and 100 rules, one 1 s sample of
    wrk, sockperf and iperf3 per point, both dataplanes): every figure is there, measured."""
    results = run(["dataplane-compare"], BenchSettings.quick())
    assert not results.errors, results.errors
    assert "dataplane-compare" not in results.notes, results.notes  # no point failed
    f = results.figures["dataplane-compare"]
    for rules in (0, 100):
        assert f[f"rules_{rules}"] == rules
        for dp in ("bpf", "iptables"):
            assert f[f"{dp}_new_conn_per_s_{rules}"] > 0
            assert f[f"{dp}_new_conn_errors_{rules}"] == 0
            assert 0 < f[f"{dp}_latency_p50_us_{rules}"] <= f[f"{dp}_latency_p99_us_{rules}"]
            assert f[f"{dp}_throughput_gbit_s_{rules}"] > 0
        assert f[f"bpf_over_iptables_new_conn_rate_{rules}"] == pytest.approx(
            f[f"bpf_new_conn_per_s_{rules}"] / f[f"iptables_new_conn_per_s_{rules}"])
    assert f["bpf_throughput_100_over_0"] == pytest.approx(
        f["bpf_throughput_gbit_s_100"] / f["bpf_throughput_gbit_s_0"])


@pytest.mark.privileged
def test_restart_figures(leaves_nothing):
    f = quick("restart")
    assert f["established_flow_resets"] == 0, f
    assert f["stale_policy_removed"] == 1 and f["new_connections_allowed"] == 1, f
    assert f["messages_while_down"] > 0 and f["resync_seconds"] > 0, f


@pytest.mark.privileged
def test_policy_programming_figures(leaves_nothing):
    f = quick("policy-programming")
    assert f["rules"] == 10_003 and f["endpoints"] == 100 and f["classifier_words"] > 0
    assert 0 < f["install_seconds_min"] <= f["install_seconds"] <= f["install_seconds_max"]
    assert 0 < f["replace_seconds_min"] <= f["replace_seconds"] <= f["replace_seconds_max"]
    for kind in ("array_batch", "hash_batch", "lpm"):
        assert f[f"writes_per_second_{kind}"] > 0


@pytest.mark.privileged
def test_agent_memory_figures(leaves_nothing):
    """The lab agent (BPF, via Typha) with 0, 200 and 500 remote endpoints: RSS sampled at
    each step, and the per-endpoint slope computed from them."""
    f = quick("agent-memory")
    assert f["remote_endpoints"] == 500
    for n in (0, 200, 500):
        assert f[f"agent_rss_mb_{n}"] > 0
    assert f["agent_rss_mb_per_1000_remote_endpoints"] == pytest.approx(
        f["kib_per_remote_endpoint"] * 1000 / 1024)
