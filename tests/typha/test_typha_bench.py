"""The `typha` benchmark runs end to end on its quick plan (a real etcd, a real
`pyfelix typha` process, simulated clients in a child process) and reports every figure.
No speed is asserted here: targets live in the benchmark's own figures. Privileged because
it runs etcd."""

from __future__ import annotations

import pytest

from pyfelix.bench import BenchSettings, run

pytestmark = pytest.mark.privileged

FIGURES = {
    "clients", "client_processes", "full_clients", "clients_connected_at_end", "endpoints",
    "updates",
    "update_rate_achieved", "fanout_p50_ms", "fanout_p99_ms", "fanout_max_ms",
    "missing_deliveries", "client_errors", "server_fanout_p99_ms", "server_rss_mb",
    "server_peak_rss_mb", "connect_seconds", "in_sync_seconds", "handshake_retries",
    "etcd_watches_with_typha",
    "etcd_watches_per_direct_client", "etcd_watches_without_typha",
}
SWEPT = {"fanout_p50_ms", "fanout_p99_ms", "connect_seconds", "in_sync_seconds",
         "server_rss_mb", "server_peak_rss_mb", "missing_deliveries", "client_errors",
         "handshake_retries"}


def test_quick_typha_bench_reports_every_figure() -> None:
    results = run(["typha"], BenchSettings.quick())
    assert results.errors == {}
    figures = results.figures["typha"]
    # the largest run's figures, and each run's swept figures suffixed with its clients
    assert set(figures) == FIGURES | {f"{name}_{count}" for name in SWEPT for count in (6, 12)}
    assert figures["clients"] == figures["clients_connected_at_end"] == 12
    for count in (6, 12):
        assert 0 < figures[f"connect_seconds_{count}"] <= figures[f"in_sync_seconds_{count}"]
        assert figures[f"missing_deliveries_{count}"] == 0
        assert 0 < figures[f"fanout_p50_ms_{count}"] <= figures[f"fanout_p99_ms_{count}"]
    assert figures["fanout_p99_ms_12"] == figures["fanout_p99_ms"]
    assert figures["endpoints"] == 300
    assert figures["full_clients"] == 4  # and each held all 300 endpoints (else an error)
    assert figures["missing_deliveries"] == 0
    assert figures["client_errors"] == 0
    assert 0 < figures["fanout_p50_ms"] <= figures["fanout_p99_ms"] <= figures["fanout_max_ms"]
    assert figures["server_rss_mb"] > 0
    # one etcd watch for the Typha server; one per client without it
    assert figures["etcd_watches_with_typha"] == 1
    assert figures["etcd_watches_per_direct_client"] == 1
    assert figures["etcd_watches_without_typha"] == 12
