"""Real traffic between lab pods with C tools from Debian: nginx + wrk, sockperf, iperf3.

Role: what `pyfelix bench dataplane-compare` drives instead of Python sockets, so the
figures measure the kernel path (and the policy the dataplane enforces on it), not the
interpreter. Servers run in one pod's namespace, clients in another's; both are started
with `nsenter --net=/run/netns/<pod ns>` (network namespace only, like the lab's agents).

- `TrafficServers`: in the server pod, nginx (one worker, no master, `return 200` on
  `HTTP_PORT`, logs and temp files in a private directory), `sockperf server --tcp` on
  `SOCKPERF_PORT` and `iperf3 -s` on `IPERF_PORT`, all bound to the pod's address.
- `run_wrk`: `wrk -H "Connection: close"`: the server closes every connection after its
  response and wrk opens a new one, so requests/s is new TCP connections/s (each a new
  flow through conntrack and the policy).
- `run_sockperf`: `sockperf ping-pong --tcp`: request/response latency on one connection.
- `run_iperf3`: `iperf3 -J`: one TCP stream's throughput.
- `parse_wrk`, `parse_sockperf`, `parse_iperf3`: the tools' outputs -> numbers; output
  that says the run failed (refused, errors only, no summary) raises `ToolRunError`.

Invariants: nothing runs outside the lab's namespaces (every command is nsenter'ed into
the pod's namespace and bound to the pod's address); every client run is bounded by a
timeout; `TrafficServers` is a context manager whose exit kills its processes (the lab's
teardown also kills whatever is left in its namespaces).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

HTTP_PORT = 80
SOCKPERF_PORT = 11111
IPERF_PORT = 5201
TOOLS = ("nginx", "wrk", "sockperf", "iperf3")
APT_PACKAGES = "nginx wrk sockperf iperf3"
START_TIMEOUT_S = 10.0
CLIENT_GRACE_S = 20.0  # added to a client's own duration for its timeout

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_UNITS_US = {"us": 1.0, "ms": 1000.0, "s": 1_000_000.0}


class ToolMissingError(RuntimeError):
    """A C tool the bench needs is not installed."""


class ToolRunError(RuntimeError):
    """A tool ran but its output shows the measurement failed."""


def require_tools() -> dict[str, str]:
    """Paths of the tools; ToolMissingError naming the missing ones and how to install them."""
    found = {tool: shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/usr/bin")
             for tool in TOOLS}
    missing = sorted(tool for tool, path in found.items() if not path)
    if missing:
        raise ToolMissingError(f"missing tool(s): {', '.join(missing)}; install them with "
                               f"scripts/setup.sh (Debian packages: {APT_PACKAGES})")
    return {tool: str(path) for tool, path in found.items()}


# --- parsers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    requests_per_s: float
    latency_p50_us: float | None = None
    latency_p99_us: float | None = None
    socket_errors: dict[str, int] = field(default_factory=dict)
    non_2xx: int = 0

    @property
    def errors(self) -> int:
        return sum(self.socket_errors.values()) + self.non_2xx


def _duration_us(text: str) -> float:
    match = re.fullmatch(r"([0-9.]+)(us|ms|s)", text.strip())
    if not match:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(match.group(1)) * _UNITS_US[match.group(2)]


def parse_wrk(text: str) -> WrkResult:
    """wrk's text report (with or without --latency)."""
    if "unable to connect" in text:
        raise ToolRunError(f"wrk could not connect: {text.strip().splitlines()[-1]}")
    total = re.search(r"^\s*(\d+) requests in ([0-9.]+)(us|ms|s|m)\b", text, re.M)
    rate = re.search(r"^Requests/sec:\s*([0-9.]+)", text, re.M)
    if not total or not rate:
        raise ToolRunError(f"wrk printed no summary: {text.strip()[-300:]!r}")
    unit = total.group(3)
    seconds = float(total.group(2)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[unit]
    percentiles = {m.group(1): _duration_us(m.group(2))
                   for m in re.finditer(r"^\s+(50|99)%\s+(\S+)\s*$", text, re.M)}
    errors: dict[str, int] = {}
    socket_line = re.search(r"Socket errors: (.*)$", text, re.M)
    if socket_line:
        for name, count in re.findall(r"(\w+) (\d+)", socket_line.group(1)):
            errors[name] = int(count)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    return WrkResult(requests=int(total.group(1)), seconds=seconds,
                     requests_per_s=float(rate.group(1)),
                     latency_p50_us=percentiles.get("50"), latency_p99_us=percentiles.get("99"),
                     socket_errors=errors, non_2xx=int(non_2xx.group(1)) if non_2xx else 0)


@dataclass(frozen=True)
class SockperfResult:
    observations: int
    avg_us: float
    percentiles_us: dict[str, float]  # "50.000" -> us, also "MIN" and "MAX"

    @property
    def p50_us(self) -> float:
        return self.percentiles_us["50.000"]

    @property
    def p99_us(self) -> float:
        return self.percentiles_us["99.000"]


def parse_sockperf(text: str) -> SockperfResult:
    """`sockperf ping-pong` output (its colour escapes are ignored)."""
    clean = _ANSI.sub("", text)
    error = re.search(r"sockperf: ERROR: (.*)", clean)
    if error:
        raise ToolRunError(f"sockperf: {error.group(1).strip()}")
    avg = re.search(r"avg-latency=([0-9.]+)", clean)
    observations = re.search(r"Total (\d+) observations", clean)
    percentiles = {m.group(1): float(m.group(2)) for m in
                   re.finditer(r"---> percentile ([0-9.]+) =\s*([0-9.]+)", clean)}
    for name in ("MAX", "MIN"):
        found = re.search(rf"---> <{name}> observation =\s*([0-9.]+)", clean)
        if found:
            percentiles[name] = float(found.group(1))
    if not avg or not observations or "50.000" not in percentiles or "99.000" not in percentiles:
        raise ToolRunError(f"sockperf printed no latency summary: {clean.strip()[-300:]!r}")
    if int(observations.group(1)) == 0:
        raise ToolRunError("sockperf: no round trip completed")
    return SockperfResult(observations=int(observations.group(1)), avg_us=float(avg.group(1)),
                          percentiles_us=percentiles)


@dataclass(frozen=True)
class IperfResult:
    seconds: float
    sent_bits_per_s: float
    received_bits_per_s: float
    retransmits: int

    @property
    def gbit_per_s(self) -> float:
        return self.received_bits_per_s / 1e9


def parse_iperf3(text: str) -> IperfResult:
    """`iperf3 -c ... -J` output."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolRunError(f"iperf3 printed no JSON ({exc}): {text.strip()[-300:]!r}") from exc
    if data.get("error"):
        raise ToolRunError(f"iperf3: {data['error']}")
    end = data.get("end") or {}
    sent, received = end.get("sum_sent"), end.get("sum_received")
    if not sent or not received:
        raise ToolRunError("iperf3: the report has no end.sum_sent/sum_received")
    return IperfResult(seconds=float(received["seconds"]),
                       sent_bits_per_s=float(sent["bits_per_second"]),
                       received_bits_per_s=float(received["bits_per_second"]),
                       retransmits=int(sent.get("retransmits", 0)))


# --- running ---------------------------------------------------------------------------


def _in_netns(netns: str, argv: list[str]) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{netns}", *argv]


def _run_client(netns: str, argv: list[str], seconds: float) -> str:
    done = subprocess.run(_in_netns(netns, argv), capture_output=True, text=True,
                          timeout=seconds + CLIENT_GRACE_S, stdin=subprocess.DEVNULL)
    out = done.stdout + done.stderr
    if done.returncode != 0 and not out.strip():
        raise ToolRunError(f"{argv[0]} exited with {done.returncode} and printed nothing")
    return out


def run_wrk(netns: str, address: str, seconds: int, connections: int = 8) -> WrkResult:
    """New connections/s: every request on its own connection (`Connection: close`)."""
    out = _run_client(netns, ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
                              "--timeout", "2s", "-H", "Connection: close",
                              f"http://{address}:{HTTP_PORT}/"], seconds)
    return parse_wrk(out)


def run_sockperf(netns: str, address: str, seconds: int, message_size: int = 64
                 ) -> SockperfResult:
    """Round-trip latency on one TCP connection (every packet after the first: conntrack)."""
    out = _run_client(netns, ["sockperf", "ping-pong", "--tcp", "-i", address, "-p",
                              str(SOCKPERF_PORT), "-t", str(seconds), "-m", str(message_size)],
                      seconds)
    return parse_sockperf(out)


def run_iperf3(netns: str, address: str, seconds: int) -> IperfResult:
    """One TCP stream's throughput, client -> server."""
    out = _run_client(netns, ["iperf3", "-c", address, "-p", str(IPERF_PORT), "-t",
                              str(seconds), "-J"], seconds)
    return parse_iperf3(out)


def _listening(netns: str, address: str, port: int) -> bool:
    done = subprocess.run(_in_netns(netns, ["ss", "-Hltn", f"sport = :{port}"]),
                          capture_output=True, text=True, timeout=10)
    return done.returncode == 0 and f"{address}:{port}" in done.stdout


NGINX_CONF = """daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  server {{
    listen {address}:{port} backlog=4096;
    location / {{ return 200 "ok\\n"; }}
  }}
}}
"""


class TrafficServers:
    """nginx, sockperf and iperf3 servers in one pod's namespace, for a `with` block."""

    def __init__(self, netns: str, address: str) -> None:
        self.netns = netns
        self.address = address
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> TrafficServers:
        require_tools()
        self._dir = tempfile.TemporaryDirectory(prefix="pyfelix-traffic-")
        work = Path(self._dir.name)
        try:
            (work / "nginx.conf").write_text(NGINX_CONF.format(
                dir=work, address=self.address, port=HTTP_PORT))
            self._spawn("nginx", ["nginx", "-c", str(work / "nginx.conf"), "-p", str(work),
                                  "-e", str(work / "error.log")], work)
            self._spawn("sockperf", ["sockperf", "server", "--tcp", "-i", self.address, "-p",
                                     str(SOCKPERF_PORT)], work)
            self._spawn("iperf3", ["iperf3", "-s", "-B", self.address, "-p", str(IPERF_PORT)],
                        work)
            for name, port in (("nginx", HTTP_PORT), ("sockperf", SOCKPERF_PORT),
                               ("iperf3", IPERF_PORT)):
                self._await_listen(name, port, work)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str], work: Path) -> None:
        with open(work / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                _in_netns(self.netns, argv), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, cwd=work, start_new_session=True)

    def _await_listen(self, name: str, port: int, work: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(self.netns, self.address, port):
            proc = self.processes[name]
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (work / f"{name}.log").read_text(errors="replace").strip()
                if name == "nginx":
                    with contextlib.suppress(OSError):
                        log += "\n" + (work / "error.log").read_text(errors="replace").strip()
                state = (f"exited with {proc.returncode}" if proc.returncode is not None
                         else f"not listening after {START_TIMEOUT_S:g}s")
                raise ToolRunError(f"{name} server in {self.netns} {state}: {log[-500:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill the servers (their process groups) and remove the work directory."""
        for proc in self.processes.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.processes.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
