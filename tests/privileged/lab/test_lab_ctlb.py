"""Host-networked clients reach Services in BPF mode: the connect-time load balancer
(bpf/ctlb.c, managers/bpf_ctlb.py) in a real lab.

The agent attaches to a cgroup v2 directory this test creates (never the machine's root
one) with BPFConnectTimeLoadBalancing=Enabled; client processes run in the node's network
namespace, inside that cgroup:
- TCP to a ClusterIP reaches a backend pod (its echo answers), and getpeername() shows the
  ClusterIP; UDP to the ClusterIP is answered from the ClusterIP's address and port;
- the backend's ingress policy decides on the real destination: a Service whose backend
  admits only some pod is not reachable from the host;
- a Service without endpoints is refused at once;
- a process of the same namespace outside the cgroup gets no translation (the programs act
  only where they are attached).
The cgroup is removed afterwards and nothing stays attached (the suite checks the machine's
cgroup root at its end).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyfelix.agent.dataplane.managers.bpf_ctlb import default_cgroup_root
from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import parse_scenario

pytestmark = pytest.mark.privileged

SCENARIO: dict[str, Any] = {
    "name": "host-networked-clusterip",
    "namespaces": [{"name": "shop"}],
    "pods": [
        *({"namespace": "shop", "name": f"web-{i}", "labels": {"app": "web"},
           "ports": [{"port": 8080, "protocol": "TCP"}, {"port": 5353, "protocol": "UDP"}]}
          for i in (1, 2)),
        {"namespace": "shop", "name": "locked", "labels": {"app": "locked"},
         "ports": [{"port": 8080, "protocol": "TCP"}]},
    ],
    "resources": [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "web", "namespace": "shop"},
         "spec": {"clusterIP": "10.96.0.30", "selector": {"app": "web"},
                  "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                            {"name": "dns", "port": 53, "protocol": "UDP",
                             "targetPort": 5353}]}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "locked", "namespace": "shop"},
         "spec": {"clusterIP": "10.96.0.31", "selector": {"app": "locked"},
                  "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "empty", "namespace": "shop"},
         "spec": {"clusterIP": "10.96.0.32", "selector": {"app": "nothing"},
                  "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}},
        # the locked backend admits pods labelled app=web only: never this host
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": {"name": "locked-from-web", "namespace": "shop"},
         "spec": {"podSelector": {"matchLabels": {"app": "locked"}},
                  "policyTypes": ["Ingress"],
                  "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}},
    ],
    "probes": [{"from": "shop/web-1", "to": "shop/web-2", "port": 8080, "protocol": "TCP",
                "expect": "allow"}],
}

# Runs in the node's namespace; prints one JSON object per check.
CLIENT = r"""
import json, socket, sys
def tcp(vip, port):
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((vip, port)); peer = s.getpeername(); s.sendall(b"ctlb")
        return {"ok": s.recv(16) == b"ctlb", "peer": list(peer)}
    except OSError as e:
        return {"ok": False, "error": type(e).__name__, "errno": e.errno}
    finally:
        s.close()
def udp(vip, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
    try:
        s.sendto(b"ctlb", (vip, port)); data, source = s.recvfrom(64)
        return {"ok": data == b"ctlb", "source": list(source)}
    except OSError as e:
        return {"ok": False, "error": type(e).__name__, "errno": e.errno}
    finally:
        s.close()
print(json.dumps({"web_tcp": tcp("10.96.0.30", 80), "web_udp": udp("10.96.0.30", 53),
                  "locked_tcp": tcp("10.96.0.31", 80), "empty_tcp": tcp("10.96.0.32", 80)}))
"""


def _client(netns: str, cgroup: Path | None) -> dict[str, Any]:
    run = ["nsenter", f"--net=/run/netns/{netns}", sys.executable, "-c", CLIENT]
    if cgroup is not None:  # join the cgroup first, then become the client
        run = ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "client", *run]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.fixture
def lab_cgroup() -> Any:
    root = default_cgroup_root()
    if not root:
        pytest.skip("no cgroup v2 hierarchy is mounted")
    path = Path(root) / f"pyfelix-test-ctlb-{secrets.token_hex(3)}"
    path.mkdir()
    try:
        yield path
    finally:
        os.rmdir(path)  # its processes have exited; attachments go with it


def test_host_networked_client_reaches_a_clusterip(lab_cgroup: Path, root_guard: Any) -> None:
    agents = AgentProcesses("bpf", extra_env={
        "FELIX_BPFCONNECTTIMELOADBALANCING": "Enabled", "FELIX_BPFCGROUPV2": str(lab_cgroup)})
    with LabRunner(parse_scenario(SCENARIO), agents=agents, dataplane="bpf",
                   program_routes=False, probe_timeout=2.0) as lab:
        lab.build()
        lab.start_agents()
        assert not [r.to_json() for r in lab.run_steps() if r.mismatch]
        node_netns = next(iter(lab.topology.nodes.values())).netns
        web = {lab.topology.pods[f"shop/web-{i}"].netns for i in (1, 2)}

        def served() -> int:
            return sum(lab.servers.served[(ns, 8080, "TCP")] for ns in web)

        before = served()
        inside = _client(node_netns, lab_cgroup)
        assert inside["web_tcp"] == {"ok": True, "peer": ["10.96.0.30", 80]}, inside
        assert served() == before + 1  # a web backend served it
        assert inside["web_udp"] == {"ok": True, "source": ["10.96.0.30", 53]}, inside
        assert not inside["locked_tcp"]["ok"], inside  # the backend's policy applied
        assert inside["empty_tcp"]["error"] == "PermissionError", inside  # refused at once

        outside = _client(node_netns, None)  # same namespace, not in the cgroup
        assert not outside["web_tcp"]["ok"], outside
    root_guard.check()
