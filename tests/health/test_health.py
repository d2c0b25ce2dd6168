"""HealthAggregator states and the HTTP endpoints on loopback."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from agent.health import HealthAggregator, HealthServer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_unreported_is_neither_live_nor_ready() -> None:
    agg = HealthAggregator(clock=Clock())
    agg.register("calc", timeout=10)
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
    finally:
        server.stop()
