"""A real etcd server for tests: Debian's `etcd` 3.4, unprivileged, on loopback only.

`EtcdServer` starts `/usr/bin/etcd` with a unique member name, a data directory under the
test's temporary directory, and free loopback ports: one peer port and TWO client ports,
one for the code under test (`endpoint`) and one for the test's own writes
(`writer_endpoint`). `start(syncer_port=False)` listens on the writer port only, so a test
can change etcd while the syncer cannot reach it (the "deletes made meanwhile" of an
outage), then `restart()` with both ports. `stop()` kills the process; `pause()`/`resume()`
send SIGSTOP/SIGCONT (an etcd that accepts connections but never answers).

Optional TLS (`tls=True`): a throwaway CA, a server certificate for 127.0.0.1 and a client
certificate, made with the `openssl` command; etcd then requires client certificates.

Teardown (`close()`, called by the fixtures also on failure) kills etcd if running and
removes its data directory; etcd also gets SIGKILL if the test process itself dies
(PR_SET_PDEATHSIG), so an interrupted run leaves no server behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pyfelix.agent.syncer.etcd_conn import EtcdConfig, EtcdConnection, EtcdError, EtcdTLS
from pyfelix.lab.ports import free_ports

ETCD_BINARY = "/usr/bin/etcd"
_counter = 0


# etcd gets SIGKILL if the test process dies (even by SIGKILL): util-linux's setpriv sets
# the parent-death signal and execs etcd. Not a preexec_fn: running Python between fork and
# exec in a process that has loaded gRPC can abort the child (gRPC's fork handlers).
DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"]


@dataclass(frozen=True)
class TLSFiles:
    ca_cert: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def make_tls_files(directory: Path) -> TLSFiles:
    """A CA, a server certificate (IP 127.0.0.1) and a client certificate, via openssl."""
    directory.mkdir(parents=True, exist_ok=True)
    d = str(directory)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=pyf-ca",
        "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt")
    ext = directory / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "extendedKeyUsage=serverAuth,clientAuth\n")
    client_ext = directory / "client.ext"
    client_ext.write_text("extendedKeyUsage=clientAuth\n")
    for name, subject, extfile in (("server", "/CN=127.0.0.1", ext),
                                   ("client", "/CN=pyfelix", client_ext)):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
            "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.csr")
        run("x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/ca.crt", "-CAkey",
            f"{d}/ca.key", "-CAcreateserial", "-days", "1", "-extfile", str(extfile),
            "-out", f"{d}/{name}.crt")
    return TLSFiles(f"{d}/ca.crt", f"{d}/server.crt", f"{d}/server.key", f"{d}/client.crt",
                    f"{d}/client.key")


class EtcdServer:
    def __init__(self, base: Path, *, tls: bool = False) -> None:
        global _counter
        _counter += 1
        self.name = f"pyf-etcd-{os.getpid()}-{_counter}"
        self.base = base / self.name
        self.data_dir = self.base / "data"
        self.log_path = self.base / "etcd.log"
        self.tls = make_tls_files(self.base / "tls") if tls else None
        self.client_port, self.writer_port, self.peer_port = free_ports(3)
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0  # how long the last start took until healthy

    # -- addresses and configs --

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def writer_endpoint(self) -> str:
        return f"127.0.0.1:{self.writer_port}"

    def config(self, *endpoints: str, request_timeout: float = 2.0) -> EtcdConfig:
        """A client config for the given endpoints (default: the syncer's), with the
        client certificate when TLS is on."""
        tls = (EtcdTLS(self.tls.ca_cert, self.tls.client_cert, self.tls.client_key)
               if self.tls else None)
        return EtcdConfig(endpoints or (self.endpoint,), tls, request_timeout)

    def writer_config(self) -> EtcdConfig:
        return self.config(self.writer_endpoint)

    # -- life cycle --

    def start(self, *, syncer_port: bool = True, timeout: float = 20.0) -> None:
        assert self.process is None, "etcd already running"
        self.base.mkdir(parents=True, exist_ok=True)
        ports = ([self.client_port] if syncer_port else []) + [self.writer_port]
        client_urls = ",".join(f"{self.scheme}://127.0.0.1:{port}" for port in ports)
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        args = [
            ETCD_BINARY, "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", client_urls,
            "--advertise-client-urls", f"{self.scheme}://127.0.0.1:{ports[0]}",
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self.name}={peer_url}", "--initial-cluster-state", "new",
            "--initial-cluster-token", self.name, "--logger", "zap", "--log-level", "warn",
        ]
        if self.tls:
            args += ["--cert-file", self.tls.server_cert, "--key-file", self.tls.server_key,
                     "--trusted-ca-file", self.tls.ca_cert, "--client-cert-auth"]
        started = time.monotonic()
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.process = subprocess.Popen([*DIE_WITH_PARENT, *args], stdout=log, stderr=log,
                                            stdin=subprocess.DEVNULL)
        finally:
            log.close()
        self._wait_healthy(timeout)
        self.start_seconds = time.monotonic() - started

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}:\n"
                                   f"{self.log_path.read_text()[-3000:]}")
            connection = EtcdConnection(self.writer_endpoint,
                                        self.config(self.writer_endpoint, request_timeout=0.5))
            try:
                connection.get(b"/health-probe")
                return
            except EtcdError as exc:
                last = exc
            finally:
                connection.close()
            time.sleep(0.05)
        raise RuntimeError(f"etcd not healthy after {timeout} s: {last}\n"
                           f"{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        """Kill etcd (SIGKILL: no goodbye to the clients, as in a crash)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=10)
        self.process = None

    def restart(self, *, syncer_port: bool = True) -> None:
        self.stop()
        self.start(syncer_port=syncer_port)

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
