"""Benchmark `restart`: kill -9 the node agent while a TCP connection is in use, change policy
while it is down, restart it; count resets of the held connection and time the resync.

The experiment (`RestartExperiment`, also driven by tests/privileged/restart):

    lab (one node, pods x/a and x/b; b serves TCP 80 and 9000)
    policies on b: allow TCP 80 from a, allow TCP 9000 from a     -> in sync, probes allow both
    a holds ONE connection to b:80 and exchanges a message every 20 ms (the whole time)
    kill -9 the agent (programs, maps, iptables chains stay in the kernel); or, with
      trigger="config", change a restart parameter (RouteRefreshInterval) in the
      FelixConfiguration: the agent exits 0 by itself, as Felix does
    delete the "allow 9000" policy while no agent runs
    restart the agent (same settings, same pin directory)         -> resync_seconds
    probes: a new connection to 80 is allowed, 9000 is now denied (stale state removed)

Agents run as the lab runs them, `nsenter --net=<node netns> pyfelix agent`
(`PinKeepingAgents` checks it), not `ip netns exec`: that remounts /sys, so the agent could
not reach the host's bpffs and its pins would die with it (agent.bpf.loader.resolve_pin_dir).

Figures:
- `config_*`: the same figures when a FelixConfiguration change made the agent exit (the
  supervisor's restart being the harness's).
- `established_flow_resets`: times the held connection failed (reset, closed, or a message
  unanswered for `REPLY_TIMEOUT_S`); must be 0.
- `resync_seconds`: from starting the new agent to its status file saying the dataplane is
  in sync and idle (includes the BPF compile, about 2-4 s here); median of the repeats.
- `messages_while_down`: messages echoed while no agent ran (the dataplane kept working);
  `stale_policy_removed` / `new_connections_allowed`: 1 when the probes after restart
  came out as expected.
Everything the run creates (namespaces, pins under /sys/fs/bpf/<run>, processes) is removed
by the lab's teardown, also on failure.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyfelix.bench.registry import BenchContext, Figures, Stat, benchmark
from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.netns import in_netns
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import parse_scenario

REPLY_TIMEOUT_S = 3.0
MESSAGE_INTERVAL_S = 0.02
DOWN_SECONDS = 1.0

SCENARIO: dict[str, Any] = {
    "name": "restart",
    "namespaces": [{"name": "x", "labels": {"ns": "x"}}],
    "pods": [
        {"namespace": "x", "name": "a", "labels": {"pod": "a"}},
        {"namespace": "x", "name": "b", "labels": {"pod": "b"},
         "ports": [{"port": 80, "protocol": "TCP"}, {"port": 9000, "protocol": "TCP"}]},
    ],
    "steps": [
        {"apply": [
            {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
             "metadata": {"name": "allow-80"},
             "spec": {"selector": "pod == 'b'", "types": ["Ingress"], "ingress": [
                 {"action": "Allow", "protocol": "TCP", "source": {"selector": "pod == 'a'"},
                  "destination": {"ports": [80]}}]}},
            {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
             "metadata": {"name": "allow-9000"},
             "spec": {"selector": "pod == 'b'", "types": ["Ingress"], "ingress": [
                 {"action": "Allow", "protocol": "TCP", "source": {"selector": "pod == 'a'"},
                  "destination": {"ports": [9000]}}]}}],
         "probes": [
             {"from": "x/a", "to": "x/b", "port": 80, "protocol": "TCP", "expect": "allow"},
             {"from": "x/a", "to": "x/b", "port": 9000, "protocol": "TCP",
              "expect": "allow"}]},
        {"delete": [{"kind": "GlobalNetworkPolicy", "name": "allow-9000"}],
         "probes": [
             {"from": "x/a", "to": "x/b", "port": 80, "protocol": "TCP", "expect": "allow"},
             {"from": "x/a", "to": "x/b", "port": 9000, "protocol": "TCP",
              "expect": "deny"}]},
    ],
}


# A FelixConfiguration change of a restart parameter (trigger="config").
RESTART_CONFIG: dict[str, Any] = {
    "apiVersion": "projectcalico.org/v3", "kind": "FelixConfiguration",
    "metadata": {"name": "default"}, "spec": {"routeRefreshInterval": "45s"}}


def _enters_network_namespace_only(proc: subprocess.Popen[bytes]) -> bool:
    args = proc.args if isinstance(proc.args, list) else []
    return bool(args) and str(args[0]) == "nsenter" and str(args[1]).startswith("--net=")


class PinKeepingAgents(AgentProcesses):
    """The lab's agent processes (entered with `nsenter --net`: host mounts kept, so pins
    land in the host's bpffs), with `kill()` (SIGKILL) and `restart()` per node."""

    def __init__(self, dataplane: str, **kw: Any) -> None:
        super().__init__(dataplane, **kw)
        self._spawn_args: dict[str, tuple[str, list[str], dict[str, str], Path]] = {}

    def _spawn(self, netns: str, args: list[str], env: dict[str, str],
               log_path: Path) -> subprocess.Popen[bytes]:
        if args and args[0] == "agent":
            self._spawn_args[args[args.index("--hostname") + 1]] = (netns, args, env, log_path)
        proc = super()._spawn(netns, args, env, log_path)
        if not _enters_network_namespace_only(proc):
            raise RuntimeError("the lab's agent processes must keep the host's mounts "
                               "(nsenter --net): pins would not survive a restart")
        return proc

    def wait_exit(self, node: str, timeout: float) -> int:
        """The agent's own exit (a restart-requiring configuration change): its status."""
        return self.processes[f"agent:{node}"].wait(timeout=timeout)

    def kill(self, node: str) -> None:
        proc = self.processes[f"agent:{node}"]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def restart(self, node: str) -> None:
        netns, args, env, log_path = self._spawn_args[node]
        self.status_paths[node].unlink(missing_ok=True)  # the dead agent's "in sync"
        self._consecutive_ok = 0
        self.processes[f"agent:{node}"] = self._spawn(netns, args, env, log_path)

    def log_text(self, node: str) -> str:
        return self._spawn_args[node][3].read_text(errors="replace")


@dataclass
class HeldFlow:
    """One TCP connection from a pod, exchanging a small message every MESSAGE_INTERVAL_S
    in a thread until stopped; any failure is recorded (and ends the flow)."""

    netns: str
    address: tuple[str, int]
    echoed: int = 0
    failures: list[str] = field(default_factory=list)
    echo_times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="held-flow", daemon=True)
        with in_netns(self.netns):
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._sock.settimeout(REPLY_TIMEOUT_S)

    def start(self) -> HeldFlow:
        self._sock.connect(self.address)
        self._thread.start()
        return self

    def _run(self) -> None:
        n = 0
        try:
            while not self._stop.is_set():
                payload = f"msg-{n:08d}\n".encode()
                self._sock.sendall(payload)
                got = b""
                while len(got) < len(payload):
                    chunk = self._sock.recv(len(payload) - len(got))
                    if not chunk:
                        raise ConnectionError("closed by peer")
                    got += chunk
                if got != payload:
                    raise ConnectionError(f"echo mismatch {got!r} != {payload!r}")
                self.echoed += 1
                self.echo_times.append(time.monotonic())
                n += 1
                self._stop.wait(MESSAGE_INTERVAL_S)
        except (OSError, ConnectionError) as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")

    def echoed_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.echo_times if start <= t < end)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=REPLY_TIMEOUT_S + 2)
        self._sock.close()


@dataclass
class RestartResult:
    dataplane: str
    established_flow_resets: int
    resync_seconds: float
    messages_while_down: int
    messages_after_restart: int
    probes_before: list[str]
    probes_after: list[str]
    failures: list[str]
    log_after_restart: str = ""

    @property
    def stale_policy_removed(self) -> bool:
        return self.probes_after[1] == "deny"

    @property
    def new_connections_allowed(self) -> bool:
        return self.probes_after[0] == "allow"


class RestartExperiment:
    """One run of the experiment in the module docstring."""

    def __init__(self, dataplane: str = "bpf", *, probe_timeout: float = 1.5,
                 trigger: str = "kill") -> None:
        if trigger not in ("kill", "config"):
            raise ValueError(f"trigger {trigger!r}: expected kill or config")
        self.dataplane = dataplane
        self.trigger = trigger
        self.probe_timeout = probe_timeout
        self.scenario = parse_scenario(SCENARIO, source="<restart benchmark>")

    def run(self, inspect: Any = None) -> RestartResult:
        """`inspect(lab, agents, phase)` is called at "before_kill" and "after_resync"
        (tests use it to read the pinned maps)."""
        agents = PinKeepingAgents(self.dataplane)
        first, second = self.scenario.steps
        with LabRunner(self.scenario, agents=agents, program_routes=False,
                       probe_timeout=self.probe_timeout,
                       handle_signals=threading.current_thread() is threading.main_thread(),
                       ) as lab:
            lab.build()
            lab.start_agents()
            lab.apply_resources(first.apply)
            lab.wait_in_sync()
            before = [r.result for r in lab.run_probes(first.probes)]
            server = self.scenario.pod("x/b")
            flow = HeldFlow(lab.topology.pods["x/a"].netns, (str(server.ip), 80)).start()
            try:
                _wait_for(lambda: flow.echoed >= 10 or bool(flow.failures), 10.0)
                if inspect is not None:
                    inspect(lab, agents, "before_kill")
                if self.trigger == "config":
                    lab.apply_resources([RESTART_CONFIG])
                    code = agents.wait_exit("node1", timeout=30.0)
                    if code != 0:
                        flow.failures.append(f"agent exited with {code} on the config change")
                else:
                    agents.kill("node1")
                killed_at = time.monotonic()
                lab.delete_resources(second.delete)
                time.sleep(DOWN_SECONDS)
                restarted_at = time.monotonic()
                agents.restart("node1")
                lab.wait_in_sync()
                resync = time.monotonic() - restarted_at
                in_sync_at = time.monotonic()
                time.sleep(0.5)
                if inspect is not None:
                    inspect(lab, agents, "after_resync")
            finally:
                flow.stop()
            after = [r.result for r in lab.run_probes(second.probes, 1)]
            log_text = agents.log_text("node1")
        return RestartResult(
            dataplane=self.dataplane,
            established_flow_resets=len(flow.failures),
            resync_seconds=resync,
            messages_while_down=flow.echoed_between(killed_at, restarted_at),
            messages_after_restart=flow.echoed_between(in_sync_at, time.monotonic()),
            probes_before=before, probes_after=after, failures=list(flow.failures),
            log_after_restart=log_text,
        )


def _wait_for(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.02)


@benchmark("restart", description="kill -9 (and a restart-parameter change) + restart of the "
                                  "BPF agent under a held TCP flow")
def restart_bench(ctx: BenchContext) -> Figures:
    if os.geteuid() != 0:
        raise PermissionError("the restart benchmark needs root (network namespaces, BPF)")
    repeats = 1 if ctx.settings.repeats <= 3 else 3
    results = [RestartExperiment("bpf").run() for _ in range(repeats)]
    figures: Figures = {
        "established_flow_resets": float(sum(r.established_flow_resets for r in results)),
        "messages_while_down": float(min(r.messages_while_down for r in results)),
        "stale_policy_removed": float(all(r.stale_policy_removed for r in results)),
        "new_connections_allowed": float(all(r.new_connections_allowed for r in results)),
        "runs": float(len(results)),
    }
    figures.update(Stat.of([r.resync_seconds for r in results]).figures("resync_seconds"))
    by_config = [RestartExperiment("bpf", trigger="config").run() for _ in range(repeats)]
    figures["config_established_flow_resets"] = float(
        sum(r.established_flow_resets for r in by_config))
    figures["config_stale_policy_removed"] = float(
        all(r.stale_policy_removed for r in by_config))
    figures.update(Stat.of([r.resync_seconds for r in by_config])
                   .figures("config_resync_seconds"))
    return figures


if __name__ == "__main__":  # python -m pyfelix.bench.restart [bpf|iptables] [kill|config]
    result = RestartExperiment(sys.argv[1] if len(sys.argv) > 1 else "bpf",
                               trigger=sys.argv[2] if len(sys.argv) > 2 else "kill").run()
    print({k: v for k, v in result.__dict__.items() if k != "log_after_restart"})
