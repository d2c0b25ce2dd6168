"""The bench charts: which series a results file yields (pure), and that drawing writes
real PNGs for what is there and nothing for what is not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyfelix.bench import plots
from pyfelix.bench.report import main as report_main

RESULTS = {
    "bpf-verdict": {"first_packet_ns_1": 160.0, "first_packet_ns_1000": 9000.0,
                    "first_packet_ns_1000_min": 8000.0, "first_packet_ns_1000_max": 11000.0,
                    "ct_hit_ns": 100.0, "harness_ns": 30.0},
    "dataplane-compare": {"rules_0": 0, "rules_1000": 1000, "rules_10000": 10000,
                          "bpf_new_conn_per_s_0": 5000.0, "bpf_new_conn_per_s_1000": 4800.0,
                          "iptables_new_conn_per_s_0": 5200.0,
                          "iptables_new_conn_per_s_1000": 2000.0,
                          "iptables_new_conn_per_s_10000": 300.0},
    "typha": {"clients": 500, "fanout_p50_ms": 150.0, "fanout_p99_ms": 480.0},
}
NOTES = {"dataplane-compare": {"bpf_10000": "FAILED: does not fit"}}


def test_per_packet_series_with_ranges():
    (series,) = plots.per_packet_series(RESULTS)
    assert series.points == {1: 160.0, 1000: 9000.0}
    assert series.ranges == {1000: (8000.0, 11000.0)}


def test_per_packet_series_per_family_and_from_a_baseline():
    results = {"bpf-verdict": {"first_packet_ns_10": 300.0, "first_packet_v6_ns_10": 320.0}}
    baseline = {"label": "linear walk", "bpf-verdict": {"first_packet_ns_10": 340.0,
                                                        "first_packet_ns_1000": 7700.0}}
    series = {s.label: s.points for s in plots.per_packet_series(results, baseline)}
    assert series == {"BPF first packet (IPv4)": {10: 300.0},
                      "BPF first packet (IPv6)": {10: 320.0},
                      "linear walk (IPv4)": {10: 340.0, 1000: 7700.0}}


def test_new_conn_series_marks_failed_points_from_notes():
    bpf, iptables = plots.new_conn_series(RESULTS, NOTES)
    assert bpf.points == {0: 5000.0, 1000: 4800.0}
    assert bpf.failed == {10000: "FAILED: does not fit"}
    assert iptables.points == {0: 5200.0, 1000: 2000.0, 10000: 300.0} and not iptables.failed


def test_typha_series_sweep_or_single_run():
    p50, p99 = plots.typha_series(RESULTS)
    assert p50.points == {500: 150.0}
    assert p99.points == {500: 480.0}
    swept = {"typha": {"fanout_p99_ms_250": 100.0, "fanout_p99_ms_1000": 700.0}}
    (only,) = plots.typha_series(swept)
    assert only.points == {250: 100.0, 1000: 700.0}


def test_typha_failed_counts_come_from_notes():
    notes = {"typha": {"clients_1000": "FAILED: dropped"}, "other": {"clients_5": "x"}}
    assert plots.typha_failed(notes) == {1000: "FAILED: dropped"}


def test_draw_all_writes_pngs_for_present_figures_only(tmp_path: Path):
    pytest.importorskip("matplotlib")
    written = plots.draw_all(RESULTS, NOTES, tmp_path)
    assert written == [plots.PER_PACKET_PNG, plots.NEW_CONN_PNG, plots.TYPHA_PNG]
    for name in written:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty"
    assert plots.draw_all({"selector": {"evals_per_s": 1.0}}, {}, empty) == []
    assert list(empty.iterdir()) == []


def test_report_with_plots_and_notes(tmp_path: Path, capsys: pytest.CaptureFixture):
    pytest.importorskip("matplotlib")
    path = tmp_path / "results.json"
    path.write_text(json.dumps({**RESULTS, "notes": NOTES}))
    assert report_main([str(path), "--plots", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "- dataplane-compare `bpf_10000`: FAILED: does not fit" in out
    assert "![new conn rate](new_conn_rate.png)" in out
    assert (tmp_path / "out" / "new_conn_rate.png").exists()
    path.write_text(json.dumps({**RESULTS, "notes": {"typha": {"x": 1}}}))
    assert report_main([str(path)]) == 1
