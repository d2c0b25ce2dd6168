"""Issue #11: real agents in network namespaces converge through a real `pyfelix typha`.

Topology (namespaces this test creates): `typha` runs in namespace A on 198.18.0.1 and
serves the file datastore; agent A runs beside it, agent B runs in namespace B
(198.18.0.2, joined to A by a veth). Agent A uses `--datastore typha://198.18.0.1:PORT`,
agent B Felix's own setting FELIX_TYPHAADDR (no --datastore); both the iptables dataplane.
Each node has one workload endpoint under a policy; the test
checks each agent programmed its endpoint's chain with the policy, then deletes the policy
in the datastore and checks both agents remove it (deletes flow through Typha too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
PORT = 15473

ENDPOINT = """
apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata: {{name: {node}-k8s-web-eth0, namespace: default, labels: {{app: web}}}}
spec: {{node: {node}, orchestrator: k8s, workload: web, pod: web, endpoint: eth0,
       interfaceName: {iface}, ipNetworks: [{ip}/32]}}
"""
POLICY = """
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: allow-web}
spec:
  selector: app == 'web'
  ingress: [{action: Allow, protocol: TCP, destination: {ports: [80]}}]
"""
NODES = {"node-a": ("cali00000000aaa", "10.65.1.1"), "node-b": ("cali00000000bbb", "10.65.2.1")}


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    tag = uuid.uuid4().hex[:6]
    a, b = f"pfty{tag}a", f"pfty{tag}b"
    try:
        for ns in (a, b):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", a, "link", "add", "ul0", "type", "veth", "peer", "name", "ul0",
           "netns", b)
        for ns, addr in ((a, "198.18.0.1/15"), (b, "198.18.0.2/15")):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", "ul0")
            sh("ip", "-n", ns, "link", "set", "ul0", "up")
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def spawn(ns: str, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-m",
                                 "pyfelix.cli.main", *args], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, **env})


def chains(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "iptables-save", "-t", "filter"],
                          capture_output=True, text=True, timeout=30).stdout


def wait_for(predicate, timeout: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in logs)
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tails}")
        time.sleep(0.2)


def in_sync(status: Path) -> bool:
    try:
        body = json.loads(status.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return bool(body.get("dataplane_in_sync") and body.get("idle"))


def test_agents_converge_through_typha(namespaces: tuple[str, str], tmp_path: Path) -> None:
    ns_a, ns_b = namespaces
    datastore = tmp_path / "ds"
    datastore.mkdir()
    for node, (iface, ip) in NODES.items():
        (datastore / f"{node}.yaml").write_text(ENDPOINT.format(node=node, iface=iface, ip=ip))
    (datastore / "policy.yaml").write_text(POLICY)
    logs = [tmp_path / "typha.log", tmp_path / "node-a.log", tmp_path / "node-b.log"]
    procs = [spawn(ns_a, ["typha", "--datastore", str(datastore), "--listen",
                          f"198.18.0.1:{PORT}", "--insecure"], logs[0], {})]
    try:
        for (node, _), ns, log in zip(NODES.items(), (ns_a, ns_b), logs[1:], strict=True):
            # a pin directory of its own: iptables mode sweeps BPFPinDir (never the default)
            env = {"FELIX_BPFENABLED": "false",
                   "FELIX_BPFPINDIR": f"/sys/fs/bpf/pyfelix-test-absent-{uuid.uuid4().hex[:8]}",
                   "FELIX_STATUSFILE": str(tmp_path / f"{node}.status.json")}
            if ns == ns_a:
                where = ["--datastore", f"typha://198.18.0.1:{PORT}"]
            else:  # configured as Felix is: FELIX_TYPHAADDR, no --datastore
                where, env["FELIX_TYPHAADDR"] = [], f"198.18.0.1:{PORT}"
            procs.append(spawn(ns, ["agent", *where, "--hostname", node], log, env))
        for node, ns in zip(NODES, (ns_a, ns_b), strict=True):
            iface = NODES[node][0]
            wait_for(lambda node=node: in_sync(tmp_path / f"{node}.status.json"), 60,
                     f"{node} in sync", logs)
            wait_for(lambda ns=ns, iface=iface: f"cali-tw-{iface}" in chains(ns)
                     and "cali-pi-" in chains(ns), 30, f"{node}'s endpoint and policy chains",
                     logs)
            # only its own endpoint: the other node's endpoint is not local here
            other = next(i for n, (i, _) in NODES.items() if n != node)
            assert f"cali-tw-{other}" not in chains(ns)
        (datastore / "policy.yaml").unlink()
        for node, ns in zip(NODES, (ns_a, ns_b), strict=True):
            wait_for(lambda ns=ns: "cali-pi-" not in chains(ns), 30,
                     f"{node} to drop the deleted policy", logs)
        assert all(p.poll() is None for p in procs), "a process died"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
