"""A real `pyfelix agent` process on an etcd datastore, inside a test's network namespace,
and the test's views of it (health, metrics, status file, iptables chains); the documents
the etcd agent tests program (a pod default/web and policies admitting one TCP port to it).

Shared by tests/privileged/reliability/test_agent_etcd.py (one etcd in the namespace) and
tests/privileged/etcd/test_etcd_cluster.py (a 3-member cluster in the namespace). The agent
runs in iptables mode with health on 127.0.0.1:9099 and metrics on 127.0.0.1:9091 of ITS
namespace, its BPF pin directory a per-test directory on bpffs; `stop()` sends SIGTERM,
then SIGKILL to its whole process group; it also gets SIGKILL if the test process dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pyfelix.agent.dataplane.iptables.names import policy_chain_name
from pyfelix.lab.netns import in_netns
from tests.privileged.etcd.etcd_server import DIE_WITH_PARENT
from tests.privileged.etcd.etcd_testlib import CALICO, namespace, pod
from tests.privileged.reliability.harness import scrape_metrics

REPO = Path(__file__).resolve().parents[3]
NODE = "node1"
POD_IP = "10.65.0.5"
PEER_IFACE = "pfetpeer0"
HEALTH_PORT = 9099
METRICS_PORT = 9091
BPFFS = Path("/sys/fs/bpf")
AGENT_STOP_TIMEOUT_S = 10.0




class EtcdAgent:
    """One `pyfelix agent` process in `netns` on etcd, and the test's views of it."""

    def __init__(self, netns: str, datastore_url: str, run_dir: Path, pin_dir: Path, *,
                 felix_env: dict[str, str] | None = None) -> None:
        """`felix_env`: extra FELIX_* settings; with it and an empty `datastore_url` the
        agent gets no --datastore and finds etcd from Felix's settings alone."""
        self.netns = netns
        self.datastore_url = datastore_url
        self.felix_env = dict(felix_env or {})
        self.log_path = run_dir / "agent.log"
        self.status_path = run_dir / "agent.status.json"
        self.pin_dir = pin_dir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "FELIX_BPFENABLED": "false",
            "FELIX_BPFPINDIR": str(self.pin_dir),
            "FELIX_INTERFACEPREFIX": "cali",
            "FELIX_HEALTHENABLED": "true",
            "FELIX_HEALTHHOST": "127.0.0.1",
            "FELIX_HEALTHPORT": str(HEALTH_PORT),
            "FELIX_PROMETHEUSMETRICSENABLED": "true",
            "FELIX_PROMETHEUSMETRICSHOST": "127.0.0.1",
            "FELIX_PROMETHEUSMETRICSPORT": str(METRICS_PORT),
            "FELIX_STATUSFILE": str(self.status_path),
            "FELIX_LOGSEVERITYSCREEN": "Info",
            **self.felix_env,
        }
        env.pop("PYFELIX_DATASTORE", None)
        datastore = ["--datastore", self.datastore_url] if self.datastore_url else []
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, *DIE_WITH_PARENT, sys.executable, "-m",
                 "pyfelix.cli.main", "agent", *datastore, "--hostname", NODE],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        """SIGTERM (a clean stop), SIGKILL to the whole group if it does not exit in time."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=AGENT_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(timeout=5)
        self._signal(signal.SIGKILL)  # anything left in its group

    def _signal(self, signum: int) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def assert_running(self) -> None:
        code = self.exit_code()
        assert code is None, f"the agent exited with {code}; log:\n{self.log_tail()}"

    def http_status(self, path: str) -> int:
        """The HTTP status of the health endpoint `path`; 0 if nothing answers."""
        with in_netns(self.netns):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{HEALTH_PORT}{path}",
                                            timeout=2) as response:
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)
            except OSError:
                return 0

    def http_body(self, path: str) -> dict[str, Any]:
        """The JSON body of the health endpoint `path` (whatever its status)."""
        with in_netns(self.netns):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{HEALTH_PORT}{path}",
                                            timeout=2) as response:
                    return dict(json.loads(response.read()))
            except urllib.error.HTTPError as exc:
                return dict(json.loads(exc.read()))

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics (`scrape_metrics`)."""
        return scrape_metrics(self.netns, METRICS_PORT)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels`."""
        wanted = {f'{k}="{v}"' for k, v in labels.items()}
        total = 0.0
        for sample, value in self.metrics().items():
            base, _, rest = sample.partition("{")
            if base == name and wanted <= set(rest.rstrip("}").split(",")):
                total += value
        return total

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.status_path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}



def mount_bpffs_if_needed() -> None:
    with open("/proc/mounts") as mounts:
        if any(line.split()[1:3] == [str(BPFFS), "bpf"] for line in mounts):
            return
    subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], check=True)



def web_policy(name: str, port: int, kind: str = "GlobalNetworkPolicy",
               namespace_name: str | None = None) -> dict[str, Any]:
    """A policy admitting TCP `port` to the pods labelled app=web."""
    metadata: dict[str, Any] = {"name": name}
    if namespace_name is not None:
        metadata["namespace"] = namespace_name
    return {"apiVersion": CALICO, "kind": kind, "metadata": metadata,
            "spec": {"selector": "app == 'web'", "types": ["Ingress"], "ingress": [
                {"action": "Allow", "protocol": "TCP", "destination": {"ports": [port]}}]}}


def inbound_chain(name: str) -> str:
    """The ingress chain of a policy of the default tier (`<ns>/<name>` if namespaced)."""
    return policy_chain_name("default", name, inbound=True)


def base_documents(*policies: dict[str, Any]) -> list[dict[str, Any]]:
    return [namespace("default"), pod("web", "default", NODE, POD_IP), *policies]


def admits_port(rules: list[str] | None, port: int) -> bool:
    return rules is not None and any(re.search(rf"\b{port}\b", rule) for rule in rules)




def chain_rules(netns: str, chain: str) -> list[str] | None:
    """The rules of `chain` in `netns`'s filter table (None: the chain does not exist)."""
    table = subprocess.run(["ip", "netns", "exec", netns, "iptables-save", "-t", "filter"],
                           check=True, capture_output=True, text=True, timeout=30).stdout
    if not re.search(rf"^:{re.escape(chain)} ", table, re.M):
        return None
    return [line for line in table.splitlines() if line.startswith(f"-A {chain} ")]
