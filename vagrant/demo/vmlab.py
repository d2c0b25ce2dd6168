#!/usr/bin/env python3
"""The Vagrant lab's workloads: the demo's pods as network namespaces on a node VM, and probes.

Role: on a node VM, do for the demo's pods what Calico's CNI plugin does in a real cluster
(namespace, veth, pod address and routes, host-side route and proxy ARP), serve every pod
port, and probe between pods. The agent, confd and BIRD on the VM do the rest: policy on the
pods' `cali` interfaces, and BGP routes to the pods of the other nodes.

Subcommands (run as root with the project's venv Python, /opt/pyfelix/.venv/bin/python):
  node-resource --name NODE --ipv4-address IP/LEN   print this node's Calico Node (YAML)
  up    --node NODE     create this node's pods, start their servers (unit pfdemo-servers)
  serve --node NODE     serve every local pod port until SIGTERM (what that unit runs)
  probe --node NODE     from each local pod, connect to every pod port of the cluster
  down  --node NODE     stop the servers, delete this node's pods
  wait-ready            poll the agent's /readiness until it answers 200 (bounded)
`--cluster FILE` (default: cluster.yaml beside this script) is the demo's cluster state.

Inputs: Pod documents (`spec.nodeName`, `status.podIP`, container ports) of the cluster file.
Outputs: namespaces `pfdemo-<namespace>.<pod>` with eth0 = the pod IP, host-side veths named
as Calico names them (`cali` + 11 hex digits of sha1("<namespace>.<pod>"),
`lab.naming.workload_interface_name`), /32 routes to local pods; probe results.

Invariants: only namespaces named `pfdemo-*` are created or deleted, `down` removes what
`up` created (deleting a namespace deletes its veth and the host route with it), `up` is
idempotent (existing pods are kept), and every wait and probe is bounded in time.

Easy to get wrong: the pod's gateway 169.254.1.1 exists nowhere; the host side answers ARP
for it by proxy ARP and a fixed MAC (ee:ee:ee:ee:ee:ee, as Calico sets it); the pod gets a
permanent neighbour entry for it so it never depends on ARP at all.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pyfelix.lab.naming import workload_interface_name

NETNS_PREFIX = "pfdemo-"
POD_IFNAME = "eth0"
POD_GATEWAY = "169.254.1.1"
HOST_SIDE_MAC = "ee:ee:ee:ee:ee:ee"
SERVERS_UNIT = "pfdemo-servers"
DEFAULT_CLUSTER = Path(__file__).resolve().with_name("cluster.yaml")
CALICO_API = "projectcalico.org/v3"
PROBE_TIMEOUT_SECONDS = 1.0
READY_URL = "http://127.0.0.1:9099/readiness"
READY_TIMEOUT_SECONDS = 120.0
READY_POLL_SECONDS = 2.0


class DemoError(RuntimeError):
    """A problem to show the user as is."""


@dataclass(frozen=True)
class DemoPod:
    namespace: str
    name: str
    node: str
    ip: ipaddress.IPv4Address
    ports: tuple[tuple[int, str], ...]  # (port, "TCP" | "UDP")
    netns_prefix: str = NETNS_PREFIX

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def netns(self) -> str:
        return f"{self.netns_prefix}{self.namespace}.{self.name}"

    @property
    def host_ifname(self) -> str:
        return workload_interface_name(self.namespace, self.name)


def _pod_from_document(doc: Mapping[str, Any], netns_prefix: str) -> DemoPod:
    metadata = doc.get("metadata") or {}
    where = f"Pod {metadata.get('namespace', 'default')}/{metadata.get('name', '?')}"
    try:
        ip = ipaddress.IPv4Address(doc["status"]["podIP"])
        node = str(doc["spec"]["nodeName"])
        ports = tuple((int(p["containerPort"]), str(p.get("protocol", "TCP")).upper())
                      for c in doc["spec"].get("containers", []) for p in c.get("ports", []))
    except (KeyError, TypeError, ValueError) as exc:
        raise DemoError(f"{where}: needs spec.nodeName, status.podIP and container ports "
                        f"({type(exc).__name__}: {exc})") from exc
    return DemoPod(str(metadata.get("namespace", "default")), str(metadata["name"]), node, ip,
                   ports, netns_prefix)


def cluster_pods(documents: Iterable[Mapping[str, Any]], *,
                 netns_prefix: str = NETNS_PREFIX) -> list[DemoPod]:
    """Every Pod of the cluster documents, sorted by namespace/name."""
    pods = [_pod_from_document(d, netns_prefix) for d in documents
            if d and d.get("apiVersion") == "v1" and d.get("kind") == "Pod"]
    return sorted(pods, key=lambda p: p.key)


def local_pods(pods: Sequence[DemoPod], node: str) -> list[DemoPod]:
    return [p for p in pods if p.node == node]


def load_cluster(path: Path) -> list[DemoPod]:
    with path.open() as stream:
        return cluster_pods(yaml.safe_load_all(stream))


def node_resource(name: str, ipv4_address: str) -> dict[str, Any]:
    """The Calico Node a node VM registers: its name and BGP address (CIDR form)."""
    interface = ipaddress.IPv4Interface(ipv4_address)
    return {"apiVersion": CALICO_API, "kind": "Node", "metadata": {"name": name},
            "spec": {"bgp": {"ipv4Address": str(interface)}}}


def plumbing_commands(pod: DemoPod, node_netns: str | None = None) -> list[list[str]]:
    """The commands that give `pod` its namespace and connect it to this node (CNI's job).

    The node is the caller's network namespace (a node VM), or `node_netns` when given (the
    tests build a node as a namespace of the machine they run on).
    """
    ns, host_if = pod.netns, pod.host_ifname
    in_pod = ["ip", "-n", ns]
    on_node = ["ip", "-n", node_netns] if node_netns else ["ip"]
    node_exec = ["ip", "netns", "exec", node_netns] if node_netns else []
    return [
        ["ip", "netns", "add", ns],
        [*on_node, "link", "add", host_if, "type", "veth", "peer", "name", POD_IFNAME,
         "netns", ns],
        [*on_node, "link", "set", host_if, "address", HOST_SIDE_MAC],
        [*node_exec, "sysctl", "-q", "-w", f"net.ipv4.conf.{host_if}.proxy_arp=1"],
        [*on_node, "link", "set", host_if, "up"],
        [*in_pod, "link", "set", "lo", "up"],
        [*in_pod, "addr", "add", f"{pod.ip}/32", "dev", POD_IFNAME],
        [*in_pod, "link", "set", POD_IFNAME, "up"],
        [*in_pod, "route", "add", POD_GATEWAY, "dev", POD_IFNAME, "scope", "link"],
        [*in_pod, "route", "add", "default", "via", POD_GATEWAY, "dev", POD_IFNAME],
        [*in_pod, "neigh", "replace", POD_GATEWAY, "lladdr", HOST_SIDE_MAC, "dev", POD_IFNAME,
         "nud", "permanent"],
        # BIRD's kernel protocol learns this route and exports it to the other nodes.
        [*on_node, "route", "replace", f"{pod.ip}/32", "dev", host_if, "scope", "link",
         "proto", "static"],
    ]


def teardown_commands(pod: DemoPod) -> list[list[str]]:
    # Deleting the namespace deletes the veth pair, and with it the host route.
    return [["ip", "netns", "delete", pod.netns]]


def run_command(argv: Sequence[str]) -> None:
    """Run one command; a failure raises DemoError with the command and its output."""
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=30,
                            check=False)
    if result.returncode != 0:
        raise DemoError(f"{' '.join(argv)}: exit {result.returncode}: "
                        f"{(result.stderr or result.stdout).strip()}")


def _existing_netns() -> set[str]:
    netns_dir = Path("/run/netns")
    return {p.name for p in netns_dir.iterdir()} if netns_dir.is_dir() else set()


def _stop_servers() -> None:
    subprocess.run(["systemctl", "stop", SERVERS_UNIT], capture_output=True, timeout=30,
                   check=False)


def cmd_up(pods: Sequence[DemoPod], node: str, cluster: Path) -> None:
    existing = _existing_netns()
    for pod in local_pods(pods, node):
        if pod.netns in existing:
            print(f"{pod.key}: exists ({pod.netns})")
            continue
        for argv in plumbing_commands(pod):
            run_command(argv)
        print(f"{pod.key}: {pod.ip} in {pod.netns}, host side {pod.host_ifname}")
    _stop_servers()
    run_command(["systemd-run", "--unit", SERVERS_UNIT, "--collect", sys.executable,
          str(Path(__file__).resolve()), "serve", "--node", node, "--cluster", str(cluster)])


def cmd_serve(pods: Sequence[DemoPod], node: str) -> None:
    from pyfelix.lab.servers import PodServers

    servers = PodServers()
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        for pod in local_pods(pods, node):
            for port, protocol in pod.ports:
                servers.add(pod.netns, port, protocol)
        servers.start()
        print(f"serving {servers.listening}", flush=True)
        signal.sigwait(stop_signals)
    finally:
        servers.stop()


def cmd_down(pods: Sequence[DemoPod], node: str) -> None:
    _stop_servers()
    existing = _existing_netns()
    for pod in local_pods(pods, node):
        if pod.netns in existing:
            for argv in teardown_commands(pod):
                run_command(argv)
            print(f"{pod.key}: deleted")


def cmd_probe(pods: Sequence[DemoPod], node: str, output: str) -> None:
    from pyfelix.lab.probe import Prober
    from pyfelix.lab.scenario import ProbeSpec

    sources = local_pods(pods, node)
    probes = [ProbeSpec(source.key, target.key, target.ip, port, protocol)
              for source in sources for target in pods if target != source
              for port, protocol in target.ports]
    prober = Prober({p.key: p.netns for p in sources}, timeout=PROBE_TIMEOUT_SECONDS)
    results = prober.run(probes)
    if output == "json":
        print(json.dumps([r.to_json() for r in results], indent=2))
        return
    for r in results:
        target = f"{r.probe.target}:{r.probe.port}/{r.probe.protocol}"
        print(f"{r.probe.source:<16} -> {target:<28} {r.result:<5} ({r.detail})")


def cmd_wait_ready(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=READY_POLL_SECONDS) as response:
                if response.status == 200:
                    print(f"{url}: ready")
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(READY_POLL_SECONDS)
    raise DemoError(f"{url}: not ready after {timeout:.0f} s (last: {last})")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vmlab.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    node_res = sub.add_parser("node-resource", help="print this node's Node resource")
    node_res.add_argument("--name", required=True)
    node_res.add_argument("--ipv4-address", required=True, help="BGP address, IP/LEN")
    for name in ("up", "serve", "probe", "down"):
        command = sub.add_parser(name)
        command.add_argument("--node", required=True)
        command.add_argument("--cluster", type=Path, default=DEFAULT_CLUSTER)
        if name == "probe":
            command.add_argument("-o", "--output", choices=("table", "json"), default="table")
    ready = sub.add_parser("wait-ready", help="poll the agent's readiness endpoint")
    ready.add_argument("--url", default=READY_URL)
    ready.add_argument("--timeout", type=float, default=READY_TIMEOUT_SECONDS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "node-resource":
            print(yaml.safe_dump(node_resource(args.name, args.ipv4_address), sort_keys=False),
                  end="")
        elif args.command == "wait-ready":
            cmd_wait_ready(args.url, args.timeout)
        else:
            pods = load_cluster(args.cluster)
            if args.command == "up":
                cmd_up(pods, args.node, args.cluster)
            elif args.command == "serve":
                cmd_serve(pods, args.node)
            elif args.command == "down":
                cmd_down(pods, args.node)
            else:
                cmd_probe(pods, args.node, args.output)
    except (DemoError, ValueError, OSError) as exc:
        print(f"vmlab.py {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
