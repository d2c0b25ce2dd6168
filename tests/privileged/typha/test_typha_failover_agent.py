"""A real agent fails over between two real Typha replicas, one of them out of sync.

Topology (a lab the test builds: one node namespace, three pods): replica A
(`pyfelix typha` on the lab's file datastore) and replica B (`pyfelix typha` on an etcd
that never answers, so its own syncer never gets in sync: it serves an empty snapshot and
says wait-for-datastore) both listen on 127.0.0.1 inside the node namespace. The agent
(iptables dataplane) uses `--datastore typha://A,B`.

1. Through A the agent programs the scenario; x/a holds a TCP connection to x/b, and a policy
   denies x/c -> x/b.
2. A is killed (SIGKILL). The agent moves to B, which cannot serve a complete snapshot: the
   agent must keep every policy (the dataplane's chains stay exactly as they were, the denial
   still denies), the held connection keeps echoing, and B's readiness is 503 throughout.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyfelix.lab.netns import in_netns
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import parse_scenario
from tests.privileged.lab.conftest import RootGuard
from tests.privileged.lab.conftest import root_guard as root_guard  # the fixture
from tests.privileged.reliability.harness import AgentUnderTest, dataplane_snapshot
from tests.privileged.reliability.test_fail_closed import Echo, tcp_ok

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
PORT_A, PORT_B, HEALTH_B = 15481, 15482, 15483
SCENARIO = {
    "name": "typha-failover",
    "namespaces": [{"name": "x"}],
    "pods": [
        {"namespace": "x", "name": "a", "ip": "10.65.0.1", "labels": {"role": "a"}},
        {"namespace": "x", "name": "b", "ip": "10.65.0.2", "labels": {"role": "b"}},
        {"namespace": "x", "name": "c", "ip": "10.65.0.3", "labels": {"role": "c"}},
    ],
}
DENY_C = {
    "apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
    "metadata": {"name": "deny-c-to-b"},
    "spec": {"selector": "role == 'b'", "types": ["Ingress"], "order": 10,
             "ingress": [{"action": "Deny", "source": {"selector": "role == 'c'"}},
                         {"action": "Allow"}]},
}


class TyphaAgent(AgentUnderTest):
    """The reliability harness's agent, fed by Typha instead of the file datastore."""

    def __init__(self, datastore_url: str) -> None:
        super().__init__({"FELIX_BPFENABLED": "false"}, keep_host_mounts=True)
        self.datastore_url = datastore_url

    def datastore_argument(self) -> str:
        return self.datastore_url


def spawn_typha(netns: str, datastore: str, port: int, log: Path,
                health_port: int | None = None) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "pyfelix.cli.main", "typha", "--datastore", datastore,
            "--listen", f"127.0.0.1:{port}", "--insecure"]
    if health_port is not None:
        args += ["--health-enabled", "--health-port", str(health_port),
                 "--health-host", "127.0.0.1"]
    with open(log, "wb") as out:
        return subprocess.Popen(["nsenter", f"--net=/run/netns/{netns}", "--", *args],
                                cwd=REPO, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def http_status(netns: str, port: int, path: str) -> int:
    with in_netns(netns):
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0


@contextlib.contextmanager
def stopped_on_exit(procs: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.mark.timeout(180)
def test_agent_moved_to_an_out_of_sync_replica_keeps_policy_and_flows(
        root_guard: RootGuard, tmp_path: Path) -> None:
    agent = TyphaAgent(f"typha://127.0.0.1:{PORT_A},127.0.0.1:{PORT_B}")
    runner = LabRunner(parse_scenario(SCENARIO, source="<typha-failover>"), agents=agent,
                       program_routes=False, probe_timeout=0.5)
    procs: list[subprocess.Popen[bytes]] = []
    with runner, stopped_on_exit(procs):
        runner.build()
        netns = next(iter(runner.topology.nodes.values())).netns
        runner.apply_resources([DENY_C])
        replica_a = spawn_typha(netns, str(runner.datastore_dir), PORT_A, tmp_path / "a.log")
        replica_b = spawn_typha(netns, "etcd3://127.0.0.1:1", PORT_B, tmp_path / "b.log",
                                health_port=HEALTH_B)
        procs += [replica_a, replica_b]
        runner.start_agents()
        runner.wait_in_sync()
        pods = runner.topology.pods
        a, b, c = pods["x/a"], pods["x/b"], pods["x/c"]
        echo = Echo(b.netns, "10.65.0.2", 5001, a.netns)
        try:
            assert echo.alive()
            assert not tcp_ok(c.netns, "10.65.0.2", 5001)  # the policy is programmed
            assert http_status(netns, HEALTH_B, "/readiness") == 503  # B is not in sync
            before = dataplane_snapshot(netns)
            replica_a.send_signal(signal.SIGKILL)
            replica_a.wait(timeout=10)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and \
                    f"connected to 127.0.0.1:{PORT_B}" not in agent.log_text():
                assert echo.alive()
                time.sleep(0.2)
            assert f"connected to 127.0.0.1:{PORT_B}" in agent.log_text(), agent.log_text()
            for _ in range(10):  # 5 s on the out-of-sync replica
                assert echo.alive()
                assert not tcp_ok(c.netns, "10.65.0.2", 5001, timeout=0.3)
                assert http_status(netns, HEALTH_B, "/readiness") == 503
                time.sleep(0.2)
            assert dataplane_snapshot(netns) == before
            assert agent.exit_code() is None
        finally:
            echo.close()
