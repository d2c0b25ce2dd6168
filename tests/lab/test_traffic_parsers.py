"""Parsing the C tools' outputs (lab.traffic). The samples in traffic_samples/ are real
outputs of Debian 12's wrk 4.1.0, sockperf 3.7 and iperf3 3.12, captured between two
namespaces on this project's machine (including failures: refused connections, a server
killed mid-run, an nginx answering 404)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyfelix.lab import traffic
from pyfelix.lab.traffic import ToolRunError, parse_iperf3, parse_sockperf, parse_wrk

SAMPLES = Path(__file__).parent / "traffic_samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_wrk_connection_close_run():
    result = parse_wrk(sample("wrk-close.txt"))
    assert result.requests == 24991
    assert result.seconds == pytest.approx(2.10)
    assert result.requests_per_s == pytest.approx(11900.54)
    assert result.latency_p50_us == pytest.approx(274.0)
    assert result.latency_p99_us == pytest.approx(1750.0)
    assert result.errors == 0 and result.socket_errors == {}


def test_wrk_socket_errors_are_counted():
    result = parse_wrk(sample("wrk-socket-errors.txt"))
    assert result.socket_errors == {"connect": 0, "read": 0, "write": 687, "timeout": 0}
    assert result.errors == 687
    assert result.requests_per_s == pytest.approx(2089.66)


def test_wrk_non_2xx_responses_are_errors():
    result = parse_wrk(sample("wrk-non2xx.txt"))
    assert result.non_2xx == 10411 and result.errors == 10411


def test_wrk_refused_raises():
    with pytest.raises(ToolRunError, match="could not connect"):
        parse_wrk(sample("wrk-refused.txt"))


def test_wrk_without_summary_raises():
    truncated = sample("wrk-close.txt").split("Requests/sec")[0]
    with pytest.raises(ToolRunError, match="no summary"):
        parse_wrk(truncated)


def test_sockperf_ping_pong():
    result = parse_sockperf(sample("sockperf-pingpong.txt"))
    assert result.observations == 78024
    assert result.avg_us == pytest.approx(9.914)
    assert result.p50_us == pytest.approx(9.083)
    assert result.p99_us == pytest.approx(25.727)
    assert result.percentiles_us["MAX"] == pytest.approx(2389.285)
    assert result.percentiles_us["MIN"] == pytest.approx(6.784)


def test_sockperf_error_raises():
    with pytest.raises(ToolRunError, match="Connection refused"):
        parse_sockperf(sample("sockperf-refused.txt"))


def test_sockperf_without_percentiles_raises():
    head = sample("sockperf-pingpong.txt").split("---> percentile 99.000")[0]
    with pytest.raises(ToolRunError, match="no latency summary"):
        parse_sockperf(head)


def test_iperf3_json():
    result = parse_iperf3(sample("iperf3.json"))
    assert result.received_bits_per_s == pytest.approx(7380671433.286105)
    assert result.sent_bits_per_s == pytest.approx(7403074204.99291)
    assert result.gbit_per_s == pytest.approx(7.380671433)
    assert result.retransmits == 64
    assert result.seconds == pytest.approx(2.005894)


def test_iperf3_error_raises():
    with pytest.raises(ToolRunError, match="Connection refused"):
        parse_iperf3(sample("iperf3-refused.json"))


def test_iperf3_not_json_raises():
    with pytest.raises(ToolRunError, match="no JSON"):
        parse_iperf3("iperf3: error - unable to connect")


def test_missing_tools_are_named(monkeypatch):
    monkeypatch.setattr(traffic.shutil, "which",
                        lambda tool, path=None: None if tool in ("wrk", "iperf3") else "/x")
    with pytest.raises(traffic.ToolMissingError, match=r"iperf3, wrk.*setup\.sh"):
        traffic.require_tools()
