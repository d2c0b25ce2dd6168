"""The calc-sync benchmark: its generated cluster, its figures (not their values: speed
targets live in the benchmark itself), and index/naive agreement on a realistic cluster."""

from __future__ import annotations

from itertools import islice

from pyfelix.bench import BenchContext, BenchSettings, known_benchmarks
from pyfelix.bench.calc_sync import (
    CHURN_BATCH,
    calc_sync_figures,
    churn_batches,
    generate_cluster,
    run_to_in_sync,
)


def test_registered_as_calc_sync() -> None:
    assert known_benchmarks()["calc-sync"].function is not None


def test_full_size_cluster_matches_the_issue() -> None:
    cluster = generate_cluster()
    kinds: dict[str, int] = {}
    for doc in cluster.docs:
        kinds[doc["kind"]] = kinds.get(doc["kind"], 0) + 1
    assert cluster.endpoints == kinds["Pod"] == 10_000
    assert cluster.local_endpoints == 20
    assert len({p["spec"]["nodeName"] for p in cluster.pods}) == 500
    assert cluster.policies == 1_000 == (kinds["NetworkPolicy"] + kinds["GlobalNetworkPolicy"])
    assert cluster.network_sets == 200 == kinds["NetworkSet"] + kinds["GlobalNetworkSet"]
    assert len({p["status"]["podIP"] for p in cluster.pods}) == 10_000


def test_indexed_and_naive_pipelines_agree_on_a_generated_cluster() -> None:
    cluster = generate_cluster(scale=0.1)
    indexed, indexed_state = run_to_in_sync(cluster)
    naive, naive_state = run_to_in_sync(cluster, naive=True)
    assert indexed_state.summary() == naive_state.summary()
    assert len(indexed_state.ip_sets) > 20 and indexed_state.policies
    assert indexed.graph.ipset_index.evaluations < naive.graph.ipset_index.evaluations / 5
    # and they stay equal under churn
    for batch in islice(churn_batches(cluster), 20):
        for pipeline in (indexed, naive):
            pipeline.on_updates(batch)
            pipeline.process_pending()
    assert indexed_state.summary() == naive_state.summary()
    assert not indexed_state.violations and not naive_state.violations


def test_churn_toggles_back_to_the_original_state() -> None:
    cluster = generate_cluster(scale=0.05)
    pipeline, state = run_to_in_sync(cluster)
    before = state.summary()
    batches = churn_batches(cluster)
    per_round = 2 * len(cluster.pods) // CHURN_BATCH  # every pod changed, then changed back
    for batch in islice(batches, per_round):
        pipeline.on_updates(batch)
        pipeline.process_pending()
    assert state.summary() == before


def test_figures_small_scale() -> None:
    figures = calc_sync_figures(BenchContext(BenchSettings(repeats=1, min_sample_seconds=0.01)),
                                scale=0.02)
    for name in ("seconds_to_in_sync", "endpoint_updates_per_s", "rss_mb",
                 "naive_seconds_to_in_sync"):
        assert figures[name] > 0, name
    assert figures["rss_mb"] >= figures["rss_baseline_mb"]
    assert figures["endpoints"] == 200
    assert figures["naive_selector_evaluations"] > figures["selector_evaluations"]
