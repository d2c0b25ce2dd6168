"""Real agents in the lab: one `pyfelix agent` per node namespace, plus confd + BIRD per
node when the scenario has several nodes (pods on different nodes then reach each other only
through BGP-learned routes), optionally all fed by one Typha.

Role: the `NodeAgents` implementation `LabRunner` drives. Per node:

    nsenter --net=/run/netns/<node ns> python -m pyfelix.cli.main agent \
        --datastore <run>/datastore ...
        env: FELIX_BPFENABLED (from --dataplane), FELIX_STATUSFILE=<run>/agents/N.status.json,
             FELIX_BPFPINDIR=<bpffs run dir>/N, FELIX_INTERFACEPREFIX
    [several nodes] nsenter ... python -m pyfelix.cli.main confd run ... (renders bird.conf)
                    then BIRD (confd.bird.BirdInstance) in the same namespace
    [typha=True]    before any agent: `pyfelix typha --insecure` in the FIRST node's
                    namespace, listening on that node's underlay IP (port TYPHA_PORT), as a
                    host-networked Typha pod would; every agent and confd then uses
                    --datastore typha://<that IP>:TYPHA_PORT instead of the directory, so the
                    whole lab reads the datastore through one watch. Plain TCP: the underlay
                    is the lab's own bridge between namespaces it created.

In-sync (`is_in_sync`, polled by the runner after every step's datastore writes): every
agent's status file says the dataplane is in sync and idle, and the agent has seen updates
at least as new as the newest write into the datastore directory. A write that changes no
resource produces no update, so after `NO_UPDATE_GRACE_S` without a newer update an idle
agent counts as in sync too. Each check must hold twice in a row, so a batch that is between
the calc graph and the dataplane is not mistaken for idleness. With several nodes, every
node must also hold a route to every existing pod of the other nodes, from whoever routes
that pod's IP pool: BIRD for pools without encapsulation, the agent's VXLAN or IPIP manager
(by their route protocols) for `vxlanMode` / `ipipMode` pools; with FloatingIPs Enabled
also a BGP route to each remote pod's floating IPs (IPv6 ones too). The lab's default pool
(`LAB_IP_POOL`, BGP-routed) is written only when the scenario declares no pool of its own;
under --ip-family ipv6 / dual (`lab.family`) its IPv6 twin too (ipv6: only the twin), and
the readiness check looks for each remote pod's IPv6 address in `ip -6` routes.

Teardown (`stop`): SIGTERM each process group, then SIGKILL after a bound; BIRD through its
own `stop()`. Agent logs stay in the run directory until the run directory is removed.
`describe()` says how the agents ran (dataplane, datastore URL, BGP), for the lab's report.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyfelix.lab.netns import in_netns
from pyfelix.lab.topology import LabTopology

NO_UPDATE_GRACE_S = 1.5
STOP_TIMEOUT_S = 10.0
START_TIMEOUT_S = 60.0
LAB_IP_POOL = "10.65.0.0/16"
TYPHA_PORT = 5473


class AgentStartError(RuntimeError):
    pass


class AgentProcesses:
    """Runs the real agent (and confd + BIRD for multi-node labs) in every node namespace."""

    enforces_policy = True

    def __init__(self, dataplane: str = "bpf", *, interface_prefix: str = "cali",
                 bgp: bool | None = None, python: str = sys.executable,
                 extra_env: dict[str, str] | None = None, typha: bool = False,
                 flow_logs: bool = False) -> None:
        if dataplane not in ("bpf", "iptables"):
            raise ValueError(f"dataplane must be bpf or iptables, not {dataplane!r}")
        self.dataplane = dataplane
        self.interface_prefix = interface_prefix
        self.bgp = bgp
        self.python = python
        self.extra_env = dict(extra_env or {})
        self.typha = typha
        # flow logs: each agent writes <run>/agents/flows/<node>/flows.log (lab.flows reads)
        self.flow_logs = flow_logs
        self.flow_log_dirs: dict[str, Path] = {}
        self.datastore_url = ""
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.birds: dict[str, Any] = {}
        self.status_paths: dict[str, Path] = {}
        self.datastore_dir: Path | None = None
        self.topology: LabTopology | None = None
        self.use_bgp = False
        self.run_dir: Path | None = None
        self._consecutive_ok = 0

    # --- NodeAgents ----------------------------------------------------------------------

    def start(self, topology: LabTopology, datastore_dir: Path, bpffs_dir: Path) -> None:
        self.datastore_dir = datastore_dir
        self.run_dir = datastore_dir.parent / "agents"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        use_bgp = self.use_bgp = self.bgp if self.bgp is not None else len(topology.nodes) > 1
        self.topology = topology
        if use_bgp:
            self._write_ip_pool(datastore_dir, topology.ip_family)
        self._check_ipip_support(topology)
        self.datastore_url = str(datastore_dir)
        if self.typha:
            self.datastore_url = self._start_typha(topology, datastore_dir)
        for name, node in topology.nodes.items():
            status = self.run_dir / f"{name}.status.json"
            self.status_paths[name] = status
            env = {
                **os.environ,
                "FELIX_BPFENABLED": "true" if self.dataplane == "bpf" else "false",
                "FELIX_STATUSFILE": str(status),
                "FELIX_BPFPINDIR": str(bpffs_dir / name),
                "FELIX_INTERFACEPREFIX": self.interface_prefix,
                "FELIX_LOGSEVERITYSCREEN": "Info",
                # the lab keeps each agent's stderr in its run directory; no felix.log/syslog
                "FELIX_LOGFILEPATH": "none",
                "FELIX_LOGSEVERITYSYS": "none",
                # the connect-time load balancer attaches to a cgroup v2 directory, by default
                # the machine's root one: lab agents attach only where a test gives them a
                # cgroup of its own (FELIX_BPFCGROUPV2 with ...=TCP|Enabled in extra_env)
                "FELIX_BPFCONNECTTIMELOADBALANCING": "Disabled",
                **self._flow_log_env(name),
                **self.extra_env,
            }
            self.processes[f"agent:{name}"] = self._spawn(
                node.netns, ["agent", "--datastore", self.datastore_url, "--hostname", name],
                env, self.run_dir / f"{name}.agent.log")
            if use_bgp:
                self._start_bgp(name, node.netns, env)

    def _flow_log_env(self, node: str) -> dict[str, str]:
        if not self.flow_logs or self.run_dir is None:
            return {}
        directory = self.flow_log_dirs[node] = self.run_dir / "flows" / node
        return {"FELIX_FLOWLOGSFILEENABLED": "true",
                "FELIX_FLOWLOGSFILEDIRECTORY": str(directory),
                "FELIX_FLOWLOGSFLUSHINTERVAL": "1"}

    def describe(self) -> dict[str, Any]:
        """How the agents run, for the lab's JSON report."""
        return {"dataplane": self.dataplane, "datastore": self.datastore_url,
                "bgp": self.use_bgp, "typha": self.typha}

    def is_in_sync(self) -> bool:
        ok = self._check_once()
        self._consecutive_ok = self._consecutive_ok + 1 if ok else 0
        return self._consecutive_ok >= 2

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=5)
        for bird in self.birds.values():
            bird.stop()
        self.birds.clear()

    # --- details ---------------------------------------------------------------------------

    def _spawn(self, netns: str, args: list[str], env: dict[str, str],
               log_path: Path) -> subprocess.Popen[bytes]:
        # nsenter --net switches the network namespace only. `ip netns exec` would also make
        # a private mount namespace with /sys remounted, hiding the host's bpffs: the agent's
        # pins would then die with it and a restarted agent could adopt nothing.
        with open(log_path, "ab") as log_file:
            return subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{netns}", self.python, "-m",
                 "pyfelix.cli.main", *args],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )

    def _start_typha(self, topology: LabTopology, datastore_dir: Path) -> str:
        """Typha in the first node's namespace; returns the URL the clients use once it
        accepts connections (AgentStartError with its log's end if it exits or never does)."""
        assert self.run_dir is not None
        host = topology.nodes[sorted(topology.nodes)[0]]
        address = (str(host.ip), TYPHA_PORT)
        key = f"typha:{host.name}"
        self.processes[key] = self._spawn(
            host.netns, ["typha", "--datastore", str(datastore_dir), "--listen",
                         f"{address[0]}:{address[1]}", "--insecure"],
            {**os.environ, **self.extra_env}, self.run_dir / f"{host.name}.typha.log")
        self._await_start(key, lambda: _accepts(host.netns, address),
                          f"did not listen on {address[0]}:{address[1]}")
        return f"typha://{address[0]}:{address[1]}"

    def _start_bgp(self, name: str, netns: str, env: dict[str, str]) -> None:
        from pyfelix.confd.bird import BirdInstance

        assert self.run_dir is not None
        bird_dir = self.run_dir / f"{name}.bird"
        bird_dir.mkdir(exist_ok=True)
        conf = bird_dir / "bird.conf"
        sock = bird_dir / "bird.ctl"
        self.processes[f"confd:{name}"] = self._spawn(
            netns, ["confd", "run", "--datastore", self.datastore_url, "--hostname", name,
                    "--interface-prefix", self.interface_prefix, "--bird-socket", str(sock),
                    "--config-file", str(conf)],
            env, self.run_dir / f"{name}.confd.log")
        self._await_start(f"confd:{name}", conf.exists, "wrote no bird.conf")
        bird = BirdInstance(netns, conf, sock, run_dir=bird_dir)
        bird.start()
        self.birds[name] = bird

    def _await_start(self, key: str, ready: Callable[[], bool], failure: str) -> None:
        """Poll `ready` until it holds; AgentStartError with the end of the process's log
        if the process `key` ("<role>:<node>") exits first, or after START_TIMEOUT_S."""
        role, _, node = key.partition(":")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            proc = self.processes[key]
            if proc.poll() is not None:
                raise AgentStartError(f"{role} on {node} exited with {proc.returncode}; its "
                                      f"log ends:\n{self._log_tail(node, role)}")
            if time.monotonic() > deadline:
                raise AgentStartError(f"{role} on {node} {failure} in {START_TIMEOUT_S:g}s")
            time.sleep(0.05)

    @staticmethod
    def _write_ip_pool(datastore_dir: Path, ip_family: str = "ipv4") -> None:
        """The lab's default pool of each family the lab runs (no encapsulation: routes
        over BGP; the IPv6 one is LAB_IP_POOL's twin, `lab.family`), unless the scenario
        declares pools of its own (written with the topology, `ippool.*.yaml`)."""
        from pyfelix.lab.family import families, ipv6_network_for

        if any(datastore_dir.glob("ippool.*.yaml")):
            return
        pools = {4: ("lab-pool", LAB_IP_POOL),
                 6: ("lab-pool-v6", str(ipv6_network_for(ipaddress.IPv4Network(LAB_IP_POOL))))}
        for family in families(ip_family):
            name, cidr = pools[family]
            pool = {"apiVersion": "projectcalico.org/v3", "kind": "IPPool",
                    "metadata": {"name": name},
                    "spec": {"cidr": cidr, "natOutgoing": False}}
            path = datastore_dir / ("lab-ippool.yaml" if family == 4 else "lab-ippool-v6.yaml")
            if not path.exists():
                path.write_text(json.dumps(pool))

    def _log_tail(self, node: str, role: str, lines: int = 15) -> str:
        """The run directory goes with the lab's teardown, so errors carry the log's end."""
        assert self.run_dir is not None
        try:
            text = (self.run_dir / f"{node}.{role}.log").read_text(errors="replace")
        except FileNotFoundError:
            return "  (no log)"
        return "\n".join("  " + line for line in text.splitlines()[-lines:])

    def _newest_write(self) -> float:
        assert self.datastore_dir is not None
        newest = self.datastore_dir.stat().st_mtime
        for root, dirs, files in os.walk(self.datastore_dir):
            # hidden entries are not resources (the agents' own status records live there)
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for entry in dirs + [f for f in files if not f.startswith(".")]:
                try:
                    newest = max(newest, os.stat(os.path.join(root, entry)).st_mtime)
                except FileNotFoundError:
                    continue
            newest = max(newest, os.stat(root).st_mtime)
        return newest

    def _check_once(self) -> bool:
        for key, proc in self.processes.items():
            if proc.poll() is not None:
                role, _, node = key.partition(":")
                raise AgentStartError(f"{key} exited with status {proc.returncode}; its log "
                                      f"ends:\n{self._log_tail(node, role)}")
        newest = self._newest_write()
        now = time.time()
        for path in self.status_paths.values():
            try:
                status = json.loads(path.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                return False
            if not (status.get("dataplane_in_sync") and status.get("idle")):
                return False
            seen = float(status.get("last_update_wall", 0.0))
            if seen < newest and now - newest < NO_UPDATE_GRACE_S:
                return False
        return not self.use_bgp or self._cross_node_routes_ready()

    def _existing_pods(self) -> set[str]:
        """`namespace/name` of the pods whose Pod document is in the datastore now (a step
        may have deleted one: it rightly has no route then)."""
        from pyfelix.agent.syncer.file import load_path

        assert self.datastore_dir is not None
        updates, _ = load_path(self.datastore_dir)
        return {f"{u.key.namespace}/{u.key.name}" for u in updates if u.key.kind == "Pod"}

    def _check_ipip_support(self, topology: LabTopology) -> None:
        """An IPIP pool on a kernel without IPIP (no tunl0, `type ipip` unknown) could never
        become ready: say so at once (AgentStartError) instead of timing out later. Probed
        by adding and removing an ipip link in the first node's namespace. The link has
        endpoints of its own (TEST-NET-1, never used): one without any would have the same
        parameters as the namespace's tunl0, which the kernel makes in every namespace once
        the ipip module is loaded, and be refused with EEXIST on a kernel that has IPIP."""
        ipip = sorted(name for _, name, mode in self._pools() if mode == "ipip")
        if not ipip or not topology.nodes:
            return
        netns = topology.nodes[sorted(topology.nodes)[0]].netns
        done = subprocess.run(["ip", "-n", netns, "link", "add", "pfipipchk", "type", "ipip",
                               "local", "192.0.2.1", "remote", "192.0.2.2"],
                              capture_output=True, text=True, timeout=10)
        if done.returncode != 0:
            raise AgentStartError(
                f"IPPool {ipip[0]} uses IPIP, but this kernel has no IPIP support "
                f"(CONFIG_NET_IPIP: {done.stderr.strip() or 'ipip link refused'}); the lab "
                "cannot run it here")
        subprocess.run(["ip", "-n", netns, "link", "del", "pfipipchk"], capture_output=True,
                       timeout=10)

    def _pools(self) -> list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str, str]]:
        """(cidr, name, routing mode) of every enabled pool in the datastore now; the
        mode is "vxlan", "ipip" or "bgp" (no encapsulation), as the route resolver says."""
        import yaml

        assert self.datastore_dir is not None
        pools = []
        # the pools' own files only (`ippool.*.yaml` as LabDatastore names them, and the
        # default pool's): this runs on every readiness poll
        paths = sorted(self.datastore_dir.glob("ippool.*.yaml"))
        paths += sorted(self.datastore_dir.glob("lab-ippool*.yaml"))
        docs = [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]
        for doc in docs:
            if doc.get("kind") != "IPPool":
                continue
            spec = doc.get("spec") or {}
            try:
                cidr = ipaddress.ip_network(str(spec.get("cidr", "")), strict=False)
            except ValueError:
                continue
            if spec.get("disabled"):
                continue
            mode = ("vxlan" if spec.get("vxlanMode", "Never") != "Never" else
                    "ipip" if spec.get("ipipMode", "Never") != "Never" else "bgp")
            pools.append((cidr, str(doc["metadata"]["name"]), mode))
        return pools

    def _floating_ips_enabled(self) -> bool:
        """FelixConfiguration `default` has floatingIPs: Enabled (the lab's agents take
        their settings from the datastore)."""
        import yaml

        assert self.datastore_dir is not None
        for path in self.datastore_dir.glob("felixconfiguration._.default.yaml"):
            doc = yaml.safe_load(path.read_text()) or {}
            value = str((doc.get("spec") or {}).get("floatingIPs", "Disabled"))
            return value.lower() == "enabled"
        return False

    def _routing_mode(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address,
                      pools: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str,
                                        str]]) -> str:
        """The mode of the most specific pool holding `address` (then by name, as the
        agent's route resolver picks); "bgp" outside every pool."""
        holding = [(-net.prefixlen, name, mode) for net, name, mode in pools
                   if net.version == address.version and address in net]
        return min(holding)[2] if holding else "bgp"

    def _cross_node_routes_ready(self) -> bool:
        """Every node has a route to every existing pod of another node, programmed by
        whoever the pod's pool says routes it: BIRD (`proto bird`) for pools without
        encapsulation, the agent's VXLAN manager (its protocol, via vxlan.calico) for VXLAN
        pools, the agent's IPIP manager (its protocol, via tunl0) for IPIP pools. Waiting for
        BGP routes in a VXLAN pool would never end: confd rightly keeps them out."""
        from pyfelix.agent.dataplane.managers.ipip import IPIP_ROUTE_PROTOCOL
        from pyfelix.agent.dataplane.managers.vxlan import VXLAN_ROUTE_PROTOCOL

        assert self.topology is not None
        existing = self._existing_pods()
        pools = self._pools()
        floating = self._floating_ips_enabled()
        protocols = {"bgp": "bird", "vxlan": str(VXLAN_ROUTE_PROTOCOL),
                     "ipip": str(IPIP_ROUTE_PROTOCOL)}
        for name, node in self.topology.nodes.items():
            nets_by_mode: dict[tuple[str, int],
                               list[ipaddress.IPv4Network | ipaddress.IPv6Network]] = {}
            for pod in self.topology.pods.values():
                if pod.node.name == name or pod.key not in existing:
                    continue
                # floating IPs travel over BGP only (BIRD advertises the agent's route)
                wanted: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, str]] = [
                    (address, "") for address in pod.spec.addresses]
                if floating:
                    wanted += [(ipaddress.ip_address(str(ip)), "bgp")
                               for ip in pod.spec.floating_ips]
                for address, forced in wanted:
                    mode = forced or self._routing_mode(address, pools)
                    key = (mode, address.version)
                    if key not in nets_by_mode:
                        done = subprocess.run(["ip", f"-{address.version}", "-n", node.netns,
                                               "-j", "route", "show", "proto", protocols[mode]],
                                              capture_output=True, text=True, timeout=10)
                        if done.returncode != 0:
                            return False
                        nets_by_mode[key] = [ipaddress.ip_network(_route_dst(r))
                                             for r in json.loads(done.stdout or "[]")]
                    if not any(address in net for net in nets_by_mode[key]):
                        return False
        return True


def _route_dst(route: dict[str, Any]) -> str:
    dst = str(route.get("dst", ""))
    return dst if "/" in dst else f"{dst}/{128 if ':' in dst else 32}"


def _accepts(netns: str, address: tuple[str, int]) -> bool:
    """A TCP connect to `address` from inside `netns` succeeds."""
    with in_netns(netns), socket.socket() as sock:
        sock.settimeout(0.5)
        try:
            sock.connect(address)
        except OSError:
            return False
    return True


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass
