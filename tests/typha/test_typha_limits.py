"""Connections that have not said hello are bounded: at most `max_pending_handshakes` at a
time (more are refused at once and counted), each with one deadline from accept to a valid
client_hello, TLS handshake included; established clients are not affected."""

from __future__ import annotations

import select
import socket
import time

import pytest
from prometheus_client import REGISTRY
from typha_certs import NODE_CN, SERVER_CN, make_pki
from typha_testlib import FileStore, RawClient, gnp, wait_until

from pyfelix.agent.typha import server as typha_server
from pyfelix.agent.typha.protocol import client_hello, encode_message
from pyfelix.agent.typha.tls import ClientTLS, ServerTLS


def _dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("typha_connections_dropped_total", {"reason": reason}) or 0.0


def test_the_documented_defaults() -> None:
    config = typha_server.ServerConfig()
    assert (config.max_pending_handshakes, config.handshake_timeout) == (250, 10.0)


def test_connections_that_never_say_hello_are_capped(store: FileStore, start_server,
                                                     start_client) -> None:
    store.put(gnp("a"))
    server = start_server(max_pending_handshakes=3, handshake_timeout=30.0)
    _, rec = start_client(server.address)
    rec.wait_converged(store.expected())  # past its hello: not pending
    before = _dropped("pending-limit")
    idle = [RawClient(server.address) for _ in range(3)]
    wait_until(lambda: server.pending_count == 3, "three idle connections pending")
    refused = RawClient(server.address)
    assert refused.message() == {
        "type": "error", "code": "server-full",
        "message": "the server already has 3 connections waiting for their hello (its "
                   "limit); try again later or another server"}
    assert refused.closed_by_server()
    assert _dropped("pending-limit") == before + 1
    assert server.pending_count == 3

    store.put(gnp("b"))  # the established client is served all along
    rec.wait_converged(store.expected())
    idle[0].close()
    wait_until(lambda: server.pending_count == 2, "a slot freed")
    fresh = RawClient(server.address)
    assert fresh.hello()["type"] == "server_hello"
    wait_until(lambda: server.pending_count == 2, "the new client past its hello")
    for raw in [*idle[1:], fresh]:
        raw.close()


def _trickle(sock: socket.socket, data: bytes, interval: float) -> None:
    """Send `data` one byte per `interval` until the server answers or closes."""
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return
        if select.select([sock], [], [], interval)[0]:
            return


def test_the_hello_deadline_counts_from_the_accept(store: FileStore, start_server) -> None:
    server = start_server(handshake_timeout=1.0)
    before = _dropped("hello-timeout")
    raw = RawClient(server.address)
    started = time.monotonic()
    # a slowloris: a valid hello, one byte every 0.3 s (each read alone would be in time)
    _trickle(raw.sock, encode_message(client_hello(hostname="slow", syncer_type="felix",
                                                   compression=["none"])), 0.3)
    error = raw.message()
    elapsed = time.monotonic() - started
    assert elapsed < 1.5, f"dropped after {elapsed:.2f} s"
    assert error == {"type": "error", "code": "bad-hello",
                     "message": "no client_hello within 1 s of connecting"}
    assert raw.closed_by_server()
    assert _dropped("hello-timeout") == before + 1
    assert server.pending_count == 0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    return make_pki(tmp_path_factory.mktemp("typha-limits-pki"))


def test_pending_tls_handshakes_count_and_time_out(pki, store: FileStore, start_server,
                                                   start_client) -> None:
    store.put(gnp("a"))
    server = start_server(tls=ServerTLS(pki.ca, pki.server.cert, pki.server.key,
                                        client_cn=NODE_CN),
                          max_pending_handshakes=2, handshake_timeout=1.5)
    refused_before = _dropped("pending-limit")
    timeouts_before = _dropped("hello-timeout")
    idle = []
    for _ in range(2):  # TCP connected, TLS never started
        idle.append(socket.create_connection(server.address, timeout=5))
    wait_until(lambda: server.pending_count == 2, "two pending TLS handshakes")
    with socket.create_connection(server.address, timeout=5) as third:
        try:
            assert third.recv(100) == b""  # closed at once, before any TLS
        except ConnectionResetError:
            pass
    assert _dropped("pending-limit") == refused_before + 1
    # the deadline frees the slots
    wait_until(lambda: server.pending_count == 0, "idle TLS connections dropped", timeout=5)
    assert _dropped("hello-timeout") == timeouts_before + 2
    for sock in idle:
        sock.settimeout(2)
        try:
            assert sock.recv(100) == b""
        except ConnectionResetError:
            pass
        sock.close()
    _, rec = start_client(server.address, tls=ClientTLS(pki.ca, pki.node.cert, pki.node.key,
                                                        server_cn=SERVER_CN))
    rec.wait_converged(store.expected())
