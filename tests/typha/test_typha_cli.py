"""`pyfelix typha`: refusals with clear messages (CliRunner), and a real run in a subprocess
that serves a client and exits cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from typha_testlib import FileStore, gnp, ippool, wait_until

from pyfelix.cli.main import cli
from pyfelix.lab.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["typha", *args], env={"PYFELIX_DATASTORE": None})
    return result.exit_code, result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--listen", "127.0.0.1:5473"], "refusing to start: give TLS settings"),
    (["--listen", "127.0.0.1:5473", "--insecure", "--ca-file", "ca.crt"],
     "--insecure cannot be combined with TLS options"),
    (["--listen", "127.0.0.1:5473", "--ca-file", "/nonexistent/ca.crt"],
     "TLS needs --ca-file, --cert-file, --key-file together: --ca-file given but "
     "--cert-file, --key-file missing"),
    (["--listen", "localhost", "--insecure"], "'localhost' is not HOST:PORT"),
    (["--listen", "127.0.0.1:5473", "--insecure", "--syncer-types", "felix,typo"],
     "syncer types ['typo'] not known; known: bgp, felix"),
    (["--listen", "127.0.0.1:5473", "--insecure", "--ping-interval", "5",
      "--pong-timeout", "2"], "pong_timeout (2.0 s) must exceed ping_interval (5.0 s)"),
    (["--listen", "127.0.0.1:5473", "--insecure", "--max-pending-handshakes", "0"],
     "Invalid value for '--max-pending-handshakes': 0 is not in the range x>=1"),
])
def test_refusals(args: list[str], message: str, tmp_path: Path) -> None:
    code, output = _invoke("--datastore", str(tmp_path), *args)
    assert code == 2, output
    assert message in " ".join(output.split())


def test_typha_datastore_is_refused(tmp_path: Path) -> None:
    code, output = _invoke("--datastore", "typha://127.0.0.1:5473", "--listen",
                           "127.0.0.1:5473", "--insecure")
    assert code == 2
    assert "--datastore cannot be another Typha" in output


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = _invoke("--datastore", str(tmp_path), "--listen", f"127.0.0.1:{port}",
                               "--insecure")
    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port}: " in output


def test_health_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = _invoke("--datastore", str(tmp_path), "--listen", "127.0.0.1:0",
                               "--insecure", "--health-enabled", "--health-host", "127.0.0.1",
                               "--health-port", str(port))
    assert code == 1
    assert f"cannot serve health checks on 127.0.0.1:{port}: " in output


def test_health_endpoints_from_the_typha_environment(store: FileStore) -> None:
    """As deploy/typha/deployment.yaml sets them: ready once every syncer is in sync."""
    store.put(gnp("a"))
    health_port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "pyfelix.cli.main", "typha", "--datastore", str(store.root),
         "--listen", f"127.0.0.1:{free_port()}", "--insecure"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO), "TYPHA_HEALTHENABLED": "true",
             "TYPHA_HEALTHPORT": str(health_port), "TYPHA_HEALTHHOST": "127.0.0.1",
             "TYPHA_SERVERMAXPENDINGHANDSHAKES": "5",
             "TYPHA_SERVERHANDSHAKETIMEOUTSECS": "3"})
    try:
        wait_until(lambda: _http(health_port, "/readiness").startswith(b"HTTP/1.0 200"),
                   "typha ready")
        ready = json.loads(_http(health_port, "/readiness").split(b"\r\n\r\n", 1)[1])
        assert {name: (r["live"], r["ready"]) for name, r in ready["reporters"].items()} == {
            "typha-server": (True, True),
            "typha-syncer-felix": (True, True),
            "typha-syncer-bgp": (True, True)}
        assert _http(health_port, "/liveness").startswith(b"HTTP/1.0 200")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, stderr = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
    assert process.returncode == 0, stderr.decode()[-2000:]


def test_serves_clients_and_stops_on_sigterm(store: FileStore, start_client) -> None:
    store.put(gnp("a"), ippool("pool", "10.65.0.0/16"))
    port = free_port()
    metrics_port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "pyfelix.cli.main", "typha", "--datastore", str(store.root),
         "--listen", f"127.0.0.1:{port}", "--insecure", "--metrics-port", str(metrics_port),
         "--metrics-host", "127.0.0.1"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        _, felix = start_client(("127.0.0.1", port), min_attempts=40)
        _, bgp = start_client(("127.0.0.1", port), syncer_type="bgp", min_attempts=40)
        felix.wait_converged(store.expected())
        bgp.wait_converged({k: v for k, v in store.state.items() if k.kind == "IPPool"})
        store.put(gnp("b"))
        felix.wait_converged(store.expected())
        wait_until(lambda: b"typha_connections_active" in _scrape(metrics_port), "metrics")
        assert b'typha_connections_active{syncer_type="bgp"} 1.0' in _scrape(metrics_port)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, stderr = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
    assert process.returncode == 0, stderr.decode()[-2000:]
    assert b"typha: serving felix, bgp from" in stderr


def _scrape(port: int) -> bytes:
    return _http(port, "/metrics")


def _http(port: int, path: str) -> bytes:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
            chunks = []
            while data := sock.recv(65536):
                chunks.append(data)
            return b"".join(chunks)
    except OSError:
        return b""
