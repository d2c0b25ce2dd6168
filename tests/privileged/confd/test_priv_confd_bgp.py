"""Two node namespaces with BIRD and confd: BGP sessions, pod routes, block export, reloads.

The test creates two network namespaces `pfcd-<pid><hex>-n1` / `-n2` (a prefix the lab's
sweep does not claim), joined by a veth pair on 198.18.0.0/15. Per node, a real confd loop
(`ConfdLoop` + the file datastore's syncer + real `bird -p` / `birdc`) writes the config, and
BIRD runs INSIDE the node's namespace (`ip netns exec NS bird -f ...`). The datastore uses a
custom BGP port and a mesh password (TCP MD5), so both reach the running daemons.

Checked, in order:
1. the mesh session reaches Established on both nodes;
2. a pod route on node 2 (a /32 on a `cali...` veth, as Felix programs it) appears in node 1's
   kernel table via BGP within 5 s (the acceptance bound; the measured time is reported as a
   test property and printed), and is withdrawn after it is deleted;
3. a BlockAffinity for node 2 added to the datastore makes node 2's confd reload BIRD: node 1
   learns the /26 and node 2 does NOT export the /32 of a pod inside that block.
Teardown (also on failure): confd loops stopped, BIRD processes killed by pid and reaped,
namespaces deleted; then the root namespace has no namespace or link of ours.

Measured (printed with -s, and as junit properties): BIRD start -> Established, pod route
add -> node 1 kernel route, datastore edit -> block route on node 1.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from pyfelix.agent.datastore import DatastoreLocation, make_syncer
from pyfelix.confd.bird import BirdInstance, BirdTools
from pyfelix.confd.watcher import ConfdLoop, ConfdReconciler

pytestmark = pytest.mark.privileged

PREFIX = "pfcd-"
LISTEN_PORT = 1790
NODE_IPS = {"node1": "198.18.0.1", "node2": "198.18.0.2"}
NODE_IPS6 = {"node1": "fd00:18::1", "node2": "fd00:18::2"}
POD_ROUTE_BOUND = 5.0  # acceptance: a new pod on node 2 is reachable from node 1 within 5 s
ESTABLISH_BOUND = 30.0


def sh(*argv: str, check: bool = True) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result.stdout


def wait_for(what: str, condition: Callable[[], bool], bound: float) -> float:
    """Poll `condition` every 10 ms; the seconds it took, or fail after `bound` seconds."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > bound:
            pytest.fail(f"{what}: not within {bound} s")
        time.sleep(0.01)
    return time.monotonic() - start


def route_line(netns: str, prefix: str) -> str:
    return sh("ip", "-n", netns, "route", "show", "exact", prefix).strip()


@dataclass
class Lab:
    run: str
    dir: Path
    datastore: Path
    netns: dict[str, str] = field(default_factory=dict)
    birds: dict[str, BirdInstance] = field(default_factory=dict)
    loops: dict[str, ConfdLoop] = field(default_factory=dict)
    reconcilers: dict[str, ConfdReconciler] = field(default_factory=dict)

    def write_resources(self, name: str, docs: list[dict]) -> None:
        staged = self.datastore / f".{name}.tmp"
        staged.write_text(yaml.safe_dump_all(docs))
        staged.rename(self.datastore / f"{name}.yaml")


def _resources() -> list[dict]:
    def doc(kind: str, name: str, spec: dict) -> dict:
        return {"apiVersion": "projectcalico.org/v3", "kind": kind, "metadata": {"name": name},
                "spec": spec}

    return [
        doc("BGPConfiguration", "default",
            {"listenPort": LISTEN_PORT, "nodeMeshPassword": {"value": "pyfelix-md5"}}),
        *(doc("Node", name, {"bgp": {"ipv4Address": f"{ip}/15"}})
          for name, ip in NODE_IPS.items()),
        doc("IPPool", "pods", {"cidr": "10.65.0.0/16"}),
    ]


def _teardown(lab: Lab) -> list[str]:
    problems = []
    for loop in lab.loops.values():
        try:
            loop.stop()
        except Exception as exc:  # keep tearing down
            problems.append(f"confd loop stop: {exc!r}")
    for bird in lab.birds.values():
        pid = bird.pid
        bird.stop()
        if pid is not None and os.path.exists(f"/proc/{pid}"):
            problems.append(f"BIRD pid {pid} still exists")
    for netns in lab.netns.values():
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
    return problems


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    if shutil.which("bird") is None or shutil.which("birdc") is None:
        pytest.skip("BIRD 2 (bird, birdc) is not installed")
    run = f"{PREFIX}{os.getpid()}{secrets.token_hex(2)}"
    lab = Lab(run, tmp_path, tmp_path / "datastore")
    lab.datastore.mkdir()
    root_links_before = sh("ip", "-o", "link", "show")
    try:
        for name in NODE_IPS:
            lab.netns[name] = f"{run}-{name[-1]}"
            sh("ip", "netns", "add", lab.netns[name])
            sh("ip", "-n", lab.netns[name], "link", "set", "lo", "up")
        ns1, ns2 = lab.netns["node1"], lab.netns["node2"]
        # created directly inside the namespaces: never in the root namespace
        sh("ip", "link", "add", "ul0", "netns", ns1, "type", "veth", "peer", "name", "ul0",
           "netns", ns2)
        for name, ip in NODE_IPS.items():
            sh("ip", "-n", lab.netns[name], "addr", "add", f"{ip}/15", "dev", "ul0")
            sh("ip", "-n", lab.netns[name], "addr", "add", f"{NODE_IPS6[name]}/64", "dev",
               "ul0", "nodad")
            sh("ip", "-n", lab.netns[name], "link", "set", "ul0", "up")
        yield lab
    finally:
        problems = _teardown(lab)
        leftovers = [n for n in sh("ip", "netns", "list").split() if n.startswith(run)]
        assert leftovers == [], f"namespaces left behind: {leftovers}"
        assert problems == [], problems
        # the root namespace has the same links as before (nothing of ours leaked into it)
        names = sorted(line.split(":")[1].strip() for line in
                       sh("ip", "-o", "link", "show").splitlines())
        names_before = sorted(line.split(":")[1].strip() for line in
                              root_links_before.splitlines())
        assert names == names_before


def start_confd(lab: Lab, node: str) -> None:
    node_dir = lab.dir / node
    node_dir.mkdir()
    reconciler = ConfdReconciler(node, node_dir / "bird.conf", node_dir / "bird.ctl",
                                 tools=BirdTools())
    loop = ConfdLoop(make_syncer(DatastoreLocation.file(lab.datastore)), reconciler,
                     reload_retry_interval=0.5)
    lab.reconcilers[node] = reconciler
    lab.loops[node] = loop
    loop.start()


def established(lab: Lab, node: str) -> bool:
    bird = lab.birds[node]
    return any(p.established for p in BirdTools().protocols(bird.socket_path))


def test_two_nodes_bgp_mesh_pod_routes_and_block_export(
        lab: Lab, record_property: Callable[[str, object], None]) -> None:
    lab.write_resources("cluster", _resources())
    for node in NODE_IPS:
        start_confd(lab, node)
    for node in NODE_IPS:  # confd writes the first checked config before BIRD starts
        wait_for(f"{node}: first config", (lab.dir / node / "bird.conf").exists, 10)
    text = (lab.dir / "node1" / "bird.conf").read_text()
    assert f"neighbor 198.18.0.2 port {LISTEN_PORT} as 64512;" in text
    assert 'password "pyfelix-md5";' in text

    start = time.monotonic()
    for node in NODE_IPS:
        bird = BirdInstance(lab.netns[node], lab.dir / node / "bird.conf",
                            lab.dir / node / "bird.ctl", run_dir=lab.dir / node)
        lab.birds[node] = bird
        bird.start()
    for node in NODE_IPS:
        wait_for(f"{node}: BGP Established", lambda n=node: established(lab, n), ESTABLISH_BOUND)
    to_established = time.monotonic() - start
    record_property("bird_start_to_established_s", round(to_established, 3))

    # a pod on node 2: veth `cali...` with a /32 route, as Felix programs it
    ns1, ns2 = lab.netns["node1"], lab.netns["node2"]
    sh("ip", "-n", ns2, "link", "add", "cali0123456789a", "type", "veth", "peer", "name", "pod0")
    sh("ip", "-n", ns2, "link", "set", "cali0123456789a", "up")
    sh("ip", "-n", ns2, "link", "set", "pod0", "up")
    start = time.monotonic()
    sh("ip", "-n", ns2, "route", "add", "10.65.9.5/32", "dev", "cali0123456789a")
    pod_route = wait_for("pod route on node 1",
                         lambda: "via 198.18.0.2" in route_line(ns1, "10.65.9.5/32"),
                         POD_ROUTE_BOUND)
    assert "proto bird" in route_line(ns1, "10.65.9.5/32")
    record_property("pod_route_add_to_peer_kernel_s", round(pod_route, 3))
    sh("ip", "-n", ns2, "route", "del", "10.65.9.5/32", "dev", "cali0123456789a")
    withdraw = wait_for("pod route withdrawn on node 1",
                        lambda: route_line(ns1, "10.65.9.5/32") == "", POD_ROUTE_BOUND)
    record_property("pod_route_del_to_withdrawn_s", round(withdraw, 3))

    # node 2 gets a block: confd re-renders and reloads BIRD; the block replaces its /32s
    reloads_before = lab.reconcilers["node2"].applied_text
    start = time.monotonic()
    lab.write_resources("blocks", [{
        "apiVersion": "projectcalico.org/v3", "kind": "BlockAffinity",
        "metadata": {"name": "node2-10-65-2-0-26"},
        "spec": {"node": "node2", "cidr": "10.65.2.0/26", "state": "confirmed"}}])
    block = wait_for("node 2's block on node 1",
                     lambda: "via 198.18.0.2" in route_line(ns1, "10.65.2.0/26"), 15)
    record_property("datastore_edit_to_block_route_s", round(block, 3))
    assert lab.reconcilers["node2"].applied_text != reloads_before
    assert "blackhole" in route_line(ns2, "10.65.2.0/26")  # the block's own blackhole
    sh("ip", "-n", ns2, "route", "add", "10.65.2.5/32", "dev", "cali0123456789a")
    tools = BirdTools()
    socket2 = lab.birds["node2"].socket_path
    wait_for("node 2's BIRD learns the pod /32",
             lambda: any(line.startswith("10.65.2.5/32") for line in
                         tools.show_route(socket2, "10.65.2.5/32").message.splitlines()), 5)
    exported = tools.show_route(socket2, "export", "Mesh_198_18_0_1").message
    assert "10.65.2.0/26" in exported and "10.65.2.5/32" not in exported
    assert route_line(ns1, "10.65.2.5/32") == ""
    print(f"\nconfd/BIRD timings: start->Established {to_established:.3f} s, pod route "
          f"{pod_route:.3f} s, withdraw {withdraw:.3f} s, datastore edit->block route "
          f"{block:.3f} s")


def route6_line(netns: str, prefix: str) -> str:
    return sh("ip", "-6", "-n", netns, "route", "show", "exact", prefix).strip()


def all_established(lab: Lab, node: str) -> bool:
    protocols = [p for p in BirdTools().protocols(lab.birds[node].socket_path)
                 if p.proto == "BGP"]
    return len(protocols) == 2 and all(p.established for p in protocols)


def test_dual_stack_mesh_learns_ipv6_pod_routes_and_blocks(lab: Lab) -> None:
    """Nodes with ipv4Address and ipv6Address: an IPv4 and an IPv6 mesh session each, an
    IPv6 pod route and an IPv6 block of node 2 reach node 1's kernel over the IPv6 session,
    and the block's own /128s are not exported."""
    docs = _resources()
    for doc in docs:
        if doc["kind"] == "Node":
            name = doc["metadata"]["name"]
            doc["spec"]["bgp"]["ipv6Address"] = f"{NODE_IPS6[name]}/64"
    docs.append({"apiVersion": "projectcalico.org/v3", "kind": "IPPool",
                 "metadata": {"name": "pods6"}, "spec": {"cidr": "fd00:65::/48"}})
    lab.write_resources("cluster", docs)
    for node in NODE_IPS:
        start_confd(lab, node)
    for node in NODE_IPS:
        wait_for(f"{node}: first config", (lab.dir / node / "bird.conf").exists, 10)
    text = (lab.dir / "node1" / "bird.conf").read_text()
    assert f"neighbor fd00:18::2 port {LISTEN_PORT} as 64512;" in text
    for node in NODE_IPS:
        bird = BirdInstance(lab.netns[node], lab.dir / node / "bird.conf",
                            lab.dir / node / "bird.ctl", run_dir=lab.dir / node)
        lab.birds[node] = bird
        bird.start()
    for node in NODE_IPS:
        wait_for(f"{node}: IPv4 and IPv6 BGP Established",
                 lambda n=node: all_established(lab, n), ESTABLISH_BOUND)

    ns1, ns2 = lab.netns["node1"], lab.netns["node2"]
    sh("ip", "-n", ns2, "link", "add", "cali0123456789b", "type", "veth", "peer", "name", "pod6")
    sh("ip", "-n", ns2, "link", "set", "cali0123456789b", "up")
    sh("ip", "-n", ns2, "link", "set", "pod6", "up")
    sh("ip", "-6", "-n", ns2, "route", "add", "fd00:65:0:9::5/128", "dev", "cali0123456789b")
    wait_for("IPv6 pod route on node 1",
             lambda: "via fd00:18::2" in route6_line(ns1, "fd00:65:0:9::5/128"), POD_ROUTE_BOUND)
    assert "proto bird" in route6_line(ns1, "fd00:65:0:9::5/128")
    # an IPv4 pod route still travels over the IPv4 session
    sh("ip", "-n", ns2, "route", "add", "10.65.9.6/32", "dev", "cali0123456789b")
    wait_for("IPv4 pod route on node 1",
             lambda: "via 198.18.0.2" in route_line(ns1, "10.65.9.6/32"), POD_ROUTE_BOUND)

    lab.write_resources("blocks", [{
        "apiVersion": "projectcalico.org/v3", "kind": "BlockAffinity",
        "metadata": {"name": "node2-fd00-65-0-2--122"},
        "spec": {"node": "node2", "cidr": "fd00:65:0:2::/122", "state": "confirmed"}}])
    wait_for("node 2's IPv6 block on node 1",
             lambda: "via fd00:18::2" in route6_line(ns1, "fd00:65:0:2::/122"), 15)
    assert "blackhole" in route6_line(ns2, "fd00:65:0:2::/122")
    sh("ip", "-6", "-n", ns2, "route", "add", "fd00:65:0:2::5/128", "dev", "cali0123456789b")
    tools = BirdTools()
    socket2 = lab.birds["node2"].socket_path
    wait_for("node 2's BIRD learns the IPv6 pod route inside its block",
             lambda: "fd00:65:0:2::5/128" in tools.show_route(
                 socket2, "fd00:65:0:2::5/128").message, 5)
    exported = tools.show_route(socket2, "export", "Mesh_fd00_18__1").message
    assert "fd00:65:0:2::/122" in exported and "fd00:65:0:2::5/128" not in exported
    assert route6_line(ns1, "fd00:65:0:2::5/128") == ""
