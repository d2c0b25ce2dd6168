"""The health and metrics servers under hostile clients (agent.httpserver), on 127.0.0.1.

Idle connections, a byte-a-second request and more connections than the cap: a normal
request is still answered within a second, the idle ones are cut off after the read timeout,
the extra ones are closed at once and counted, and the thread count stays bounded.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from pyfelix.agent import metrics
from pyfelix.agent.health import HealthAggregator, HealthServer

CAP = 8
READ_TIMEOUT = 1.0


def _sample(name: str, server: str) -> float:
    return REGISTRY.get_sample_value(name, {"server": server}) or 0.0


@pytest.fixture
def health() -> Iterator[HealthServer]:
    agg = HealthAggregator()
    agg.register("dataplane", timeout=60).report(ready=True)
    server = HealthServer(agg, "127.0.0.1", 0, max_connections=CAP, read_timeout=READ_TIMEOUT)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _idle(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks.append(sock)
    return socks


def _closed_by_server(sock: socket.socket, within: float) -> float | None:
    """Seconds until the server closed `sock` (EOF or reset), None if it stayed open."""
    started = time.monotonic()
    sock.settimeout(within)
    try:
        data = sock.recv(4096)
    except TimeoutError:
        return None
    except ConnectionResetError:
        data = b""
    assert data == b"", f"server sent {data!r} to a client that asked nothing"
    return time.monotonic() - started


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_idle_connections_do_not_block_liveness_and_are_cut_off(health: HealthServer) -> None:
    threads_before = threading.active_count()
    timed_out_before = _sample("pyfelix_http_connections_timed_out_total", "health")
    opened = time.monotonic()
    idle = _idle(health.port, CAP - 2)
    try:
        assert _wait(lambda: health.active_connections == CAP - 2, 2.0)
        started = time.monotonic()
        status, body = _get(health.port, "/liveness", timeout=1.0)
        assert status == 200 and json.loads(body)["ok"] is True
        assert time.monotonic() - started < 1.0
        # a thread per connection being served, and never more than the cap
        assert threading.active_count() <= threads_before + CAP
        for sock in idle:
            waited = _closed_by_server(sock, within=READ_TIMEOUT + 2.0)
            assert waited is not None, "an idle connection was never closed"
        assert time.monotonic() - opened < READ_TIMEOUT + 1.5
        assert _wait(lambda: health.active_connections == 0, 2.0)
        assert _wait(lambda: threading.active_count() <= threads_before, 2.0)
        assert (_sample("pyfelix_http_connections_timed_out_total", "health")
                == timed_out_before + CAP - 2)
    finally:
        for sock in idle:
            sock.close()


def test_a_trickled_request_is_cut_off_at_the_deadline(health: HealthServer) -> None:
    sock = socket.create_connection(("127.0.0.1", health.port), timeout=5)
    started = time.monotonic()
    closed_at = None
    try:
        for byte in b"GET /liveness HTTP/1.0\r\nHost: x\r\n":
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_at = time.monotonic()
                break
            sock.settimeout(0.25)  # a byte every 0.25 s: no single read waits long
            try:
                if sock.recv(4096) == b"":
                    closed_at = time.monotonic()
                    break
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed_at = time.monotonic()
                break
        assert closed_at is not None, "the trickling client was served to the end"
        assert closed_at - started < READ_TIMEOUT + 1.0
    finally:
        sock.close()
    assert _get(health.port, "/liveness", timeout=1.0)[0] == 200


def test_connections_beyond_the_cap_are_closed_at_once_and_counted(
        health: HealthServer) -> None:
    threads_before = threading.active_count()
    rejected_before = _sample("pyfelix_http_connections_rejected_total", "health")
    idle = _idle(health.port, CAP)
    extra: list[socket.socket] = []
    try:
        assert _wait(lambda: health.active_connections == CAP, 2.0)
        extra = _idle(health.port, 5)
        for sock in extra:
            waited = _closed_by_server(sock, within=0.5)
            assert waited is not None and waited < 0.5, "a connection beyond the cap stayed"
        assert (_sample("pyfelix_http_connections_rejected_total", "health")
                == rejected_before + 5)
        assert threading.active_count() <= threads_before + CAP
        # once the idle ones time out, the server answers again
        assert _wait(lambda: health.active_connections == 0, READ_TIMEOUT + 2.0)
        assert _get(health.port, "/liveness", timeout=1.0)[0] == 200
    finally:
        for sock in idle + extra:
            sock.close()


def test_metrics_server_has_the_same_bounds() -> None:
    server = metrics.serve_metrics("127.0.0.1", 0, max_connections=CAP,
                                   read_timeout=READ_TIMEOUT)
    threads_before = threading.active_count()
    idle: list[socket.socket] = []
    try:
        idle = _idle(server.port, CAP - 1)
        started = time.monotonic()
        status, body = _get(server.port, "/metrics", timeout=1.0)
        assert status == 200 and b"pyfelix_http_connections_rejected_total" in body
        assert time.monotonic() - started < 1.0
        assert threading.active_count() <= threads_before + CAP
        for sock in idle:
            assert _closed_by_server(sock, within=READ_TIMEOUT + 2.0) is not None
        assert _wait(lambda: server.active_connections == 0, 2.0)
    finally:
        for sock in idle:
            sock.close()
        server.stop()
