"""The agent as operators run it: a real `pyfelix agent` process in a network namespace.

Checks issue #8's acceptance lines: readiness turns 200 after in-sync; the metrics named in
the issue are exported; SIGTERM exits 0 within 10 s and leaves the dataplane programmed; a
bad configuration is one clear error and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]

POLICY = """
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: allow-web}
spec:
  selector: app == 'web'
  ingress: [{action: Allow, protocol: TCP, destination: {ports: [80]}}]
---
apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata: {name: node1-k8s-web-eth0, namespace: default, labels: {app: web}}
spec: {node: node1, orchestrator: k8s, workload: web, pod: web, endpoint: eth0,
       interfaceName: cali0123456789a, ipNetworks: [10.65.0.5/32]}
"""


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"pfag{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def in_ns(netns: str, *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", netns, *args], capture_output=True,
                          text=True, timeout=30, **kwargs)


def http_get(netns: str, port: int, path: str) -> tuple[int, str]:
    script = (
        "import sys, urllib.request, urllib.error\n"
        f"try:\n r = urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=2)\n"
        " print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n print(e.code); print(e.read().decode())\n"
        "except OSError as e:\n print(0); print(e)\n"
    )
    done = in_ns(netns, sys.executable, "-c", script)
    status, _, body = done.stdout.partition("\n")
    return int(status or 0), body


def own_pin_dir() -> dict[str, str]:
    """A BPFPinDir of this test's own that never exists: an iptables-mode agent sweeps its
    pin directory (BPF -> iptables cleanup), which must never be the machine's default."""
    return {"FELIX_BPFPINDIR": f"/sys/fs/bpf/pyfelix-test-absent-{uuid.uuid4().hex[:8]}"}


def start_agent(netns: str, datastore: Path, env: dict[str, str],
                log: Path, *, config_file: Path | None = None) -> subprocess.Popen[bytes]:
    extra = ["--config-file", str(config_file)] if config_file is not None else []
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "pyfelix.cli.main", "agent",
             "--datastore", str(datastore), "--hostname", "node1", *extra],
            cwd=REPO, env={**os.environ, **own_pin_dir(), **env}, stdout=out,
            stderr=subprocess.STDOUT)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def test_health_metrics_and_sigterm(netns: str, tmp_path: Path) -> None:
    datastore = tmp_path / "ds"
    datastore.mkdir()
    (datastore / "resources.yaml").write_text(POLICY)
    env = {"FELIX_BPFENABLED": "false", "FELIX_HEALTHENABLED": "true",
           "FELIX_HEALTHHOST": "127.0.0.1", "FELIX_HEALTHPORT": "9099",
           "FELIX_PROMETHEUSMETRICSENABLED": "true", "FELIX_PROMETHEUSMETRICSPORT": "9091",
           "FELIX_STATUSFILE": str(tmp_path / "status.json")}
    agent = start_agent(netns, datastore, env, tmp_path / "agent.log")
    try:
        wait_for(lambda: http_get(netns, 9099, "/liveness")[0] == 200, 30, "liveness 200")
        wait_for(lambda: http_get(netns, 9099, "/readiness")[0] == 200, 30, "readiness 200")
        # every loop reports its own liveness (agent.health), the interface monitor too
        live = json.loads(http_get(netns, 9099, "/liveness")[1])
        assert live["problems"] == []
        assert set(live["reporters"]) == {"datastore", "calc-graph", "dataplane",
                                          "iface-monitor"}
        # the status file is written by the main thread's tick (every 0.1 s), which may
        # come just after the loops reported ready
        def status_in_sync() -> bool:
            try:
                status = json.loads((tmp_path / "status.json").read_text())
            except (OSError, ValueError):
                return False
            return bool(status["dataplane_in_sync"] and status["calc_in_sync"])

        wait_for(status_in_sync, 10, "status file in sync")
        code, metrics = http_get(netns, 9091, "/metrics")
        assert code == 200
        for name in ("felix_active_local_endpoints 1.0", "felix_active_local_policies 1.0",
                     "felix_calc_graph_output_events_total", "felix_resync_state 3.0",
                     "felix_int_dataplane_apply_time_seconds_count",
                     "felix_int_dataplane_failures_total", "felix_ipsets_calico",
                     "felix_calc_graph_update_time_seconds_count",
                     "pyfelix_validation_errors_total", "pyfelix_dataplane_in_sync 1.0",
                     'pyfelix_http_connections_rejected_total{server="health"} 0.0',
                     'pyfelix_http_connections_active{server="metrics"} 1.0'):
            assert name in metrics, f"{name} missing from /metrics"
        # the GC policy froze the long-lived state at the first in-sync tick
        frozen = re.search(r"^pyfelix_gc_frozen_objects (\S+)$", metrics, re.M)
        assert frozen and float(frozen.group(1)) > 1000, "GC policy did not settle"
        # Felix's status reporting: this node's record in the datastore while it runs
        check = subprocess.run([sys.executable, "-m", "pyfelix.cli.main", "status", "--datastore",
                                str(datastore), "--hostname", "node1", "--check"],
                               cwd=REPO, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
        assert (datastore / ".status" / "nodes" / "node1.json").exists()
        got = subprocess.run([sys.executable, "-m", "pyfelix.cli.main", "get", "status", "node1",
                              "--datastore", str(datastore), "-o", "json"],
                             cwd=REPO, capture_output=True, text=True, timeout=30)
        assert got.returncode == 0, got.stderr
        assert "node1" in json.dumps(json.loads(got.stdout)["nodes"])
        chains_before = in_ns(netns, "iptables-save", "-t", "filter").stdout
        assert "cali-tw-cali0123456789a" in chains_before
        started = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0
        assert time.monotonic() - started < 10
        # the programmed dataplane stays in place after a clean stop
        chains_after = in_ns(netns, "iptables-save", "-t", "filter").stdout
        assert "cali-tw-cali0123456789a" in chains_after
        # ...and a clean stop removes the node's status record
        assert not (datastore / ".status" / "nodes" / "node1.json").exists()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


@pytest.mark.parametrize(("env", "fragment"), [
    ({"FELIX_HEALTHPORT": "70000"}, "HealthPort: 70000 is not a port number"),
    ({"FELIX_BPFENABLED": "perhaps"}, "BPFEnabled: 'perhaps' is not a boolean"),
    ({"FELIX_NOSUCHSETTING": "1"}, "NOSUCHSETTING: unknown parameter"),
])
def test_bad_config_is_one_clear_error(netns: str, tmp_path: Path, env: dict[str, str],
                                       fragment: str) -> None:
    datastore = tmp_path / "ds"
    datastore.mkdir()
    done = in_ns(netns, sys.executable, "-m", "pyfelix.cli.main", "agent", "--datastore",
                 str(datastore), "--hostname", "node1", cwd=REPO,
                 env={**os.environ, **own_pin_dir(), **env})
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and fragment in errors[0], done.stderr
