"""Lab helpers for the Felix-extras tests: a lab with real agents, an external host, and TCP
servers that remember who connected.

- `agent_lab(scenario, dataplane)`: a `LabRunner` with `AgentProcesses(bgp=False)` (no BIRD:
  cross-node traffic has only what the agents program), built and with agents started;
  torn down on exit (also on failure).
- `ExternalHost`: a namespace `<run id>-x-ext` (named as the lab names its own, so the lab's
  teardown and sweep remove it too) on the lab's underlay bridge, with an address in the
  underlay and optional routes - the "internet" or an admin's machine.
- `RecordingServer`: a TCP listener inside any lab namespace that accepts, records the peer
  address, echoes one read and closes; bounded (accept timeout, connection timeout).
- `tcp_connect(netns, ip, port)`: True when a connection from inside `netns` is accepted.
- `RootSnapshot`: links, routes and lab-named namespaces of the root namespace (the
  `root_unchanged` fixture compares before and after).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyroute2 import IPRoute

from pyfelix.lab import naming
from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.netns import create_netns, in_netns, list_netns
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import parse_scenario
from pyfelix.lab.topology import UNDERLAY_BRIDGE

CONNECT_TIMEOUT = 1.0


@contextlib.contextmanager
def agent_lab(scenario: dict[str, Any], dataplane: str, *,
              extra_env: dict[str, str] | None = None) -> Iterator[LabRunner]:
    agents = AgentProcesses(dataplane, bgp=False, extra_env=extra_env)
    runner = LabRunner(parse_scenario(scenario), agents=agents, dataplane=dataplane,
                       program_routes=False, static_cross_node_routes=False,
                       probe_timeout=0.5)
    with runner:
        runner.build()
        runner.start_agents()
        runner.wait_in_sync()
        yield runner


def apply_and_sync(lab: LabRunner, docs: list[dict[str, Any]]) -> None:
    lab.apply_resources(docs)
    lab.wait_in_sync()


@dataclass
class ExternalHost:
    lab: LabRunner
    address: str = "198.18.1.100"
    prefixlen: int = 15
    routes: dict[str, str] = field(default_factory=dict)  # dst -> gateway

    @property
    def netns(self) -> str:
        return f"{self.lab.run_id}-x-ext"

    def create(self) -> ExternalHost:
        create_netns(self.netns)
        with contextlib.closing(IPRoute(netns=self.lab.topology.underlay_netns)) as ul:
            ul.link("add", ifname="x0", kind="veth",
                    peer={"ifname": "eth0", "net_ns_fd": self.netns})
            port = ul.link_lookup(ifname="x0")[0]
            bridge = ul.link_lookup(ifname=UNDERLAY_BRIDGE)[0]
            ul.link("set", index=port, master=bridge, state="up")
        with contextlib.closing(IPRoute(netns=self.netns)) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            eth0 = ipr.link_lookup(ifname="eth0")[0]
            ipr.addr("add", index=eth0, address=self.address, prefixlen=self.prefixlen)
            ipr.link("set", index=eth0, state="up")
            for dst, gateway in self.routes.items():
                ipr.route("add", dst=dst, gateway=gateway, oif=eth0)
        return self


class RecordingServer:
    """Accepts TCP connections on (address, port) inside `netns`; records peer addresses."""

    def __init__(self, netns: str, port: int, address: str = "0.0.0.0") -> None:
        with in_netns(netns):
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, port))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.peers: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self.peers.append(peer[0])
            with conn:
                conn.settimeout(0.5)
                with contextlib.suppress(OSError):
                    data = conn.recv(64)
                    if data:
                        conn.sendall(data)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self._sock.close()


def tcp_connect(netns: str, ip: str, port: int, timeout: float = CONNECT_TIMEOUT) -> bool:
    """Connect from inside `netns`, send a token, expect it back."""
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect((ip, port))
            sock.sendall(b"pyfelix")
            return sock.recv(64) == b"pyfelix"
        except OSError:
            return False


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def run_in(netns: str, *argv: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, *argv], check=True,
                          capture_output=True, text=True, timeout=30).stdout


@dataclass(frozen=True)
class RootSnapshot:
    links: frozenset[str]
    routes: frozenset[str]
    lab_netns: frozenset[str]

    @classmethod
    def take(cls) -> RootSnapshot:
        def run(*argv: str) -> list[str]:
            out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
            return [line.strip() for line in out.splitlines() if line.strip()]

        links = frozenset(":".join(part.strip() for part in line.split(":")[:2])
                          for line in run("ip", "-o", "link", "show"))
        return cls(links=links, routes=frozenset(run("ip", "route", "show", "table", "all")),
                   lab_netns=frozenset(n for n in list_netns()
                                       if naming.parse_run_id(n) is not None))
