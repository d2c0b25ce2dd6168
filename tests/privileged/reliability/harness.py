"""Reliability-test harness: one real agent in a lab node that tests can kill, restart, starve.

Role: what the reliability tests share.
- `AgentUnderTest`: a `NodeAgents` for the lab that runs ONE `pyfelix agent` (iptables
  dataplane) in the single node namespace, like `lab.agents.AgentProcesses`, plus what
  fault tests need: extra environment (a PATH with failing wrappers, short fail-closed bounds),
  `kill9()`, `restart()`, `exit_code()`, the agent's log and its Prometheus metrics (read
  inside the node namespace).
- `ConformanceLab`: the conformance world (x/y/z x a/b/c) built with that agent, moved
  between conformance cases (`enter(case)` applies the difference), checked against the
  cases' EXPECTED matrices (`mismatches(case)`).
- `FlowKeeper`: long-lived TCP/UDP flows between pods that send and check an echo every
  few tens of milliseconds and record any break.
- `dataplane_snapshot()`: the node's iptables-save + ipset save, normalised (no counters),
  for "nothing half-applied" comparisons.

Invariants: everything lives in the lab's namespaces; every wait is bounded; `stop()` ends
the agent's whole process group (also after a restart).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pyfelix.lab.conformance.case import Case
from pyfelix.lab.conformance.matrix import CellResult, MatrixProber, expected_cells
from pyfelix.lab.conformance.plan import (
    DocKey,
    desired_documents,
    resource_ref,
    step_between,
    world_documents,
)
from pyfelix.lab.conformance.world import World, pod_ip, scenario_data
from pyfelix.lab.netns import in_netns
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import parse_scenario
from pyfelix.lab.topology import LabTopology

REPO = Path(__file__).resolve().parents[3]
METRICS_PORT = 9091
STOP_TIMEOUT_S = 10.0
NO_UPDATE_GRACE_S = 1.5


def scrape_metrics(netns: str, port: int) -> dict[str, float]:
    """Every sample of the /metrics served on 127.0.0.1:`port` inside `netns`:
    `name{label="v",...}` (labels sorted) -> value."""
    with in_netns(netns):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=5).read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples

class AgentUnderTest:
    """One pyfelix agent (iptables dataplane) in the lab's node namespace."""

    enforces_policy = True

    def __init__(self, extra_env: Mapping[str, str] | None = None, *,
                 keep_host_mounts: bool = False) -> None:
        self.extra_env = dict(extra_env or {})
        # True: enter the node with `nsenter --net` (the host's bpffs stays visible, so BPF
        # pins outlive the agent, as on a real node); False: `ip netns exec`
        self.keep_host_mounts = keep_host_mounts
        self.process: subprocess.Popen[bytes] | None = None
        self.topology: LabTopology | None = None
        self.datastore_dir: Path | None = None
        self.run_dir: Path | None = None
        self.bpffs_dir: Path | None = None
        self.starts = 0
        self._consecutive_ok = 0

    @property
    def node(self) -> str:
        assert self.topology is not None
        return next(iter(self.topology.nodes))

    @property
    def netns(self) -> str:
        assert self.topology is not None
        return self.topology.nodes[self.node].netns

    @property
    def status_path(self) -> Path:
        assert self.run_dir is not None
        return self.run_dir / "agent.status.json"

    @property
    def log_path(self) -> Path:
        assert self.run_dir is not None
        return self.run_dir / "agent.log"

    # --- NodeAgents --------------------------------------------------------------------------

    def start(self, topology: LabTopology, datastore_dir: Path, bpffs_dir: Path) -> None:
        if len(topology.nodes) != 1:
            raise ValueError("AgentUnderTest runs single-node labs")
        self.topology = topology
        self.datastore_dir = datastore_dir
        self.bpffs_dir = bpffs_dir
        self.run_dir = datastore_dir.parent / "agents"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.spawn()

    def is_in_sync(self) -> bool:
        ok = self._check_once()
        self._consecutive_ok = self._consecutive_ok + 1 if ok else 0
        return self._consecutive_ok >= 2

    def describe(self) -> dict[str, Any] | None:
        return {"dataplane": "iptables", "datastore": str(self.datastore_dir)}

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _signal_group(self.process, signal.SIGKILL)
                self.process.wait(timeout=5)
        else:
            _signal_group(self.process, signal.SIGKILL)  # leftovers of its group, if any

    # --- faults ------------------------------------------------------------------------------

    def spawn(self, extra_env: Mapping[str, str] | None = None) -> None:
        """Start the agent (again); a stale status file is removed first, so in-sync is
        judged on what the NEW process writes."""
        assert self.datastore_dir is not None and self.bpffs_dir is not None
        if extra_env is not None:
            self.extra_env = dict(extra_env)
        self.status_path.unlink(missing_ok=True)
        env = {
            **os.environ,
            "FELIX_BPFENABLED": "false",
            "FELIX_STATUSFILE": str(self.status_path),
            "FELIX_BPFPINDIR": str(self.bpffs_dir / self.node),
            "FELIX_INTERFACEPREFIX": "cali",
            "FELIX_LOGSEVERITYSCREEN": "Info",
            "FELIX_PROMETHEUSMETRICSENABLED": "true",
            "FELIX_PROMETHEUSMETRICSHOST": "127.0.0.1",
            "FELIX_PROMETHEUSMETRICSPORT": str(METRICS_PORT),
            **self.extra_env,
        }
        with open(self.log_path, "ab") as log:
            log.write(f"=== agent start {self.starts + 1} ===\n".encode())
            log.flush()
            enter = (["nsenter", f"--net=/run/netns/{self.netns}", "--"]
                     if self.keep_host_mounts else ["ip", "netns", "exec", self.netns])
            self.process = subprocess.Popen(
                [*enter, sys.executable, "-m", "pyfelix.cli.main", "agent",
                 "--datastore", self.datastore_argument(), "--hostname", self.node],
                cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True)
        self.starts += 1
        self._consecutive_ok = 0

    def datastore_argument(self) -> str:
        """What the agent's --datastore is (subclasses may feed it through Typha)."""
        return str(self.datastore_dir)

    def kill9(self) -> None:
        assert self.process is not None
        _signal_group(self.process, signal.SIGKILL)
        self.process.wait(timeout=5)

    def restart(self, extra_env: Mapping[str, str] | None = None) -> None:
        self.stop()
        self.spawn(extra_env)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.status_path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def metrics(self) -> dict[str, float]:
        """Every sample of the agent's /metrics (see `scrape_metrics`)."""
        return scrape_metrics(self.netns, METRICS_PORT)

    def _check_once(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            code = None if self.process is None else self.process.returncode
            raise RuntimeError(f"the agent is not running (exit {code}); log:\n"
                               + "\n".join(self.log_text().splitlines()[-15:]))
        status = self.status()
        if not (status.get("dataplane_in_sync") and status.get("idle")):
            return False
        newest = _newest_mtime(self.datastore_dir)
        seen = float(status.get("last_update_wall", 0.0))
        return not (seen < newest and time.time() - newest < NO_UPDATE_GRACE_S)


def _newest_mtime(directory: Path | None) -> float:
    assert directory is not None
    newest = directory.stat().st_mtime
    for entry in directory.iterdir():
        try:
            newest = max(newest, entry.stat().st_mtime)
        except FileNotFoundError:
            continue
    return newest


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


def wait_for(condition: Callable[[], Any], timeout: float, what: str,
             poll: float = 0.1) -> Any:
    """Poll `condition` until it returns something truthy; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)


# --- the conformance world with one agent ------------------------------------------------------

class ConformanceLab:
    """The conformance world in a lab with one `AgentUnderTest`, moved between cases."""

    def __init__(self, runner: LabRunner, agent: AgentUnderTest, probe_timeout: float) -> None:
        self.runner = runner
        self.agent = agent
        self.base = world_documents(runner.scenario, runner.topology)
        self.current: dict[DocKey, dict[str, Any]] = World.base().documents(self.base)
        self.prober = MatrixProber({k: p.netns for k, p in runner.topology.pods.items()},
                                   timeout=probe_timeout)

    def enter(self, case: Case, *, wait: bool = True) -> None:
        """Write the difference between the current state and `case`'s into the datastore;
        with `wait`, wait until the agent is in sync."""
        desired = desired_documents(case, self.base)
        apply, delete = step_between(self.current, desired)
        if apply:
            self.runner.apply_resources(apply)
        if delete:
            self.runner.delete_resources([resource_ref(k) for k in delete])
        self.current = desired
        if wait:
            self.runner.wait_in_sync()

    def write_raw(self, name: str, content: bytes) -> Path:
        """Put a file into the datastore directory atomically (rename from staging)."""
        staged = self.runner.state.staging_dir / name
        staged.write_bytes(content)
        target = self.runner.datastore_dir / name
        os.replace(staged, target)
        return target

    def mismatches(self, case: Case) -> list[CellResult]:
        """Probe `case`'s whole expected matrix; the cells whose verdict differs."""
        return [r for r in self.prober.run(expected_cells(case)) if r.mismatch]

    def host_interface(self, pod: str) -> str:
        return self.runner.topology.pods[pod].host_ifname


@contextmanager
def conformance_lab(agent: AgentUnderTest, *, probe_timeout: float = 0.5
                    ) -> Iterator[ConformanceLab]:
    scenario = parse_scenario(scenario_data("reliability"), source="<reliability>")
    runner = LabRunner(scenario, agents=agent, program_routes=False,
                       probe_timeout=probe_timeout)
    with runner:
        runner.build()
        runner.start_agents()
        runner.wait_in_sync()
        yield ConformanceLab(runner, agent, probe_timeout)


def describe(results: list[CellResult]) -> str:
    return "\n".join(f"{r.cell.source} -> {r.cell.target} {r.cell.column}: expected "
                     f"{r.cell.expect_word}, got {r.got_word} ({r.detail})" for r in results)


# --- dataplane snapshots -------------------------------------------------------------------------

_COUNTERS = re.compile(r" \[\d+:\d+\]$")
_IPSET_INITVAL = re.compile(r" initval 0x[0-9a-f]+")  # random per (re)creation


def dataplane_snapshot(netns: str) -> dict[str, list[str]]:
    """The node's filter/raw/mangle/nat tables (iptables-save, counters stripped) and ipsets
    (`ipset save` without the random hash seed, sorted): equal snapshots mean the same
    programmed dataplane."""
    snapshot: dict[str, list[str]] = {}
    saved = subprocess.run(["ip", "netns", "exec", netns, "iptables-save"], check=True,
                           capture_output=True, text=True, timeout=30).stdout
    snapshot["iptables"] = sorted(
        _COUNTERS.sub("", line) for line in saved.splitlines()
        if line and not line.startswith("#"))
    ipsets = subprocess.run(["ip", "netns", "exec", netns, "ipset", "save"], check=True,
                            capture_output=True, text=True, timeout=30).stdout
    snapshot["ipset"] = sorted(_IPSET_INITVAL.sub("", line) for line in ipsets.splitlines()
                               if line)
    return snapshot


def snapshot_difference(a: dict[str, list[str]], b: dict[str, list[str]]) -> str:
    lines = []
    for key in sorted(set(a) | set(b)):
        only_a = sorted(set(a.get(key, [])) - set(b.get(key, [])))
        only_b = sorted(set(b.get(key, [])) - set(a.get(key, [])))
        lines += [f"{key} only before: {x}" for x in only_a]
        lines += [f"{key} only after:  {x}" for x in only_b]
    return "\n".join(lines)


# --- long-lived flows --------------------------------------------------------------------------

@dataclass
class Flow:
    source: str
    target: str
    port: int
    protocol: str
    round_trips: int = 0
    last_echo: float = 0.0
    broken: str | None = None
    echo_times: list[float] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} {self.protocol}/{self.port}"


class FlowKeeper:
    """Keeps flows open (one socket each, created in the source pod's namespace) and sends
    a fresh token every `interval` seconds; a flow breaks when an echo is missing for
    `patience` seconds, or on any socket error. Bounded: `stop()` joins every thread."""

    def __init__(self, lab: ConformanceLab, flows: list[Flow], *, interval: float = 0.05,
                 patience: float = 2.0) -> None:
        self.lab = lab
        self.flows = flows
        self.interval = interval
        self.patience = patience
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._keep, args=(f,), daemon=True)
                         for f in flows]

    def __enter__(self) -> FlowKeeper:
        for thread in self._threads:
            thread.start()
        wait_for(lambda: all(f.round_trips > 0 or f.broken for f in self.flows), 10,
                 "every flow's first echo")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.patience + 5)

    @property
    def broken(self) -> list[Flow]:
        return [f for f in self.flows if f.broken]

    def echoes_between(self, start: float, end: float) -> dict[str, int]:
        return {str(f): sum(1 for t in f.echo_times if start <= t <= end) for f in self.flows}

    def _keep(self, flow: Flow) -> None:
        namespace, name = flow.target.split("/")
        address = (str(pod_ip(namespace, name)), flow.port)
        kind = socket.SOCK_STREAM if flow.protocol == "TCP" else socket.SOCK_DGRAM
        with in_netns(self.lab.runner.topology.pods[flow.source].netns):
            sock = socket.socket(socket.AF_INET, kind | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(self.patience)
            sock.connect(address)
            counter = 0
            while not self._stop.is_set():
                counter += 1
                token = f"flow-{counter:08d}".encode()
                sock.sendall(token) if flow.protocol == "TCP" else sock.send(token)
                if not self._await_echo(sock, token, flow):
                    flow.broken = f"no echo of token {counter} within {self.patience:g}s"
                    return
                flow.round_trips += 1
                flow.last_echo = time.monotonic()
                flow.echo_times.append(flow.last_echo)
                self._stop.wait(self.interval)
        except OSError as exc:
            flow.broken = f"socket error: {exc}"
        finally:
            sock.close()

    def _await_echo(self, sock: socket.socket, token: bytes, flow: Flow) -> bool:
        deadline = time.monotonic() + self.patience
        received = b""
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(64)
            except TimeoutError:
                return False
            if flow.protocol == "UDP":
                if chunk == token:
                    return True
                continue  # a late echo of an earlier token
            if not chunk:
                raise ConnectionResetError("connection closed by the peer")
            received += chunk
            if received == token:
                return True
        return False
