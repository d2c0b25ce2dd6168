"""HealthAggregator states and the HTTP endpoints on loopback."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from pyfelix.agent.health import HealthAggregator, HealthServer, report_interval


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_unreported_is_not_ready_and_not_live_after_its_timeout() -> None:
    clock = Clock()
    agg = HealthAggregator(clock=clock)
    agg.register("calc", timeout=10)
    assert agg.is_live() and not agg.is_ready()
    clock.now += 10.5
    assert not agg.is_live() and not agg.is_ready()


def test_liveness_times_out_and_readiness_follows_reports() -> None:
    clock = Clock()
    agg = HealthAggregator(clock=clock)
    agg.register("calc", timeout=10)
    agg.register("syncer", live=False, ready=True)
    agg.report("calc", ready=True)
    agg.report("syncer", ready=False)
    assert agg.is_live() and not agg.is_ready()
    agg.report("syncer", ready=True)
    assert agg.is_ready()
    clock.now = 11
    assert not agg.is_live()


def test_a_silent_reporter_fails_liveness_naming_itself_and_why() -> None:
    clock = Clock()
    agg = HealthAggregator(clock=clock)
    dataplane = agg.register("dataplane", timeout=30)
    calc = agg.register("calc-graph", timeout=60)
    dataplane.report(ready=True)
    calc.report(ready=True)
    clock.now = 30.0
    assert agg.is_live()  # exactly at the timeout is still in time
    clock.now = 31.2
    calc.report(ready=True)
    assert agg.liveness_problems() == ["dataplane: no report for 31.2 s (timeout 30 s)"]
    assert not agg.is_live()
    summary = agg.summary()
    assert summary["dataplane"]["live"] is False and summary["calc-graph"]["live"] is True
    assert summary["dataplane"]["last_report_age"] == 31.2
    # readiness keeps its meaning: what each reporter last said, however long ago
    assert agg.is_ready()
    dataplane.report(ready=True)
    assert agg.is_live() and agg.liveness_problems() == []


def test_reported_not_live_and_never_reported_are_named() -> None:
    clock = Clock()
    agg = HealthAggregator(clock=clock)
    agg.register("dataplane", timeout=30).report(live=False, ready=False,
                                                 detail="failed closed")
    agg.register("iface-monitor", ready=False, timeout=30)
    agg.register("calc-graph", timeout=30)
    # a reporter still starting is not ready, but not dead either until its timeout
    assert agg.liveness_problems() == ["dataplane: reported not live (failed closed)"]
    assert sorted(agg.readiness_problems()) == [
        "calc-graph: never reported", "dataplane: reported not ready (failed closed)"]
    clock.now += 31
    assert sorted(agg.liveness_problems()) == [
        "calc-graph: never reported in 31.0 s (timeout 30 s)",
        "dataplane: no report for 31.0 s (timeout 30 s)",
        "iface-monitor: never reported in 31.0 s (timeout 30 s)"]


def test_timeout_overrides_felix_alias_and_zero() -> None:
    clock = Clock()
    agg = HealthAggregator(clock=clock, timeout_overrides={
        "InternalDataplaneMainLoop": 120, "calc-graph": 0, "typo": 5})
    dataplane = agg.register("dataplane", timeout=90)
    calc = agg.register("calc-graph", timeout=60)
    assert (dataplane.timeout, calc.timeout) == (120, 0)
    assert agg.unknown_overrides() == ["typo"]
    dataplane.report(ready=True)
    calc.report(ready=True)
    clock.now = 10_000.0
    assert agg.liveness_problems() == ["dataplane: no report for 10000.0 s (timeout 120 s)"]


def test_report_interval_is_a_third_of_the_timeout_at_most_ten_seconds() -> None:
    assert report_interval(90) == 10.0
    assert report_interval(3) == 1.0
    assert report_interval(0) == 10.0  # never times out: report at Felix's pace anyway


def _get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_http_endpoints() -> None:
    agg = HealthAggregator()
    agg.register("dataplane", timeout=60)
    server = HealthServer(agg, "127.0.0.1", 0)
    server.start()
    try:
        status, body = _get(server.port, "/readiness")
        assert status == 503 and body["reporters"]["dataplane"]["ready"] is False
        agg.report("dataplane", ready=True)
        assert _get(server.port, "/readiness")[0] == 200
        assert _get(server.port, "/liveness")[0] == 200
        agg.report("dataplane", live=False, ready=True, detail="stuck")
        status, body = _get(server.port, "/liveness")
        assert status == 503
        assert body["problems"] == ["dataplane: reported not live (stuck)"]
    finally:
        server.stop()
