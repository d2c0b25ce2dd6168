"""A real 3-member etcd cluster for tests (Debian's etcd 3.4), inside a network namespace.

`EtcdCluster` creates a namespace of its own (`pfec<hex>`, loopback up) and starts the
members in it with `ip netns exec`: each listens for clients on the namespace's
127.0.0.1:<client port> (what an agent running in the same namespace is given, as
`etcd3://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C`) and on a unix socket in its own directory
(`unix_endpoint`: how code in the test process, which stays in the root namespace, reaches
the same member: the filesystem is shared, the network is not). Peers talk over the
namespace's loopback. Nothing listens in the machine's root namespace.

Each member runs as a uid of its own (65400 + index), so that `partition(member)` can cut it
off from its peers with iptables rules in the cluster's namespace (`heal(member)` removes
them): a member that is running and answering its clients, but without a quorum.

Member life cycle: `kill(member)` sends SIGKILL (a crash: no goodbye to clients or peers),
`restart(*members)` starts them again on their data directories (they rejoin as
followers).
`status(member)` asks a member for its id and the leader it knows (Maintenance.Status);
`leader()` is the member every live member agrees on; `move_leader(to)` hands the
leadership over (Maintenance.MoveLeader, sent to the current leader).

Teardown (`close()`, also on failure and Ctrl-C through the fixtures' ExitStack): every
member is killed, the namespace deleted and the directory removed; members also get
SIGKILL if the test process dies (setpriv --pdeathsig, see etcd_server.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
from pyetcd import etcdrpc

from pyfelix.agent.syncer.etcd_conn import EtcdConfig, EtcdConnection, EtcdError
from tests.privileged.etcd.etcd_server import DIE_WITH_PARENT, ETCD_BINARY

SOCKET_NAME = "client:1"  # etcd's unix URL must look like host:port
_FIRST_PORT = 23790  # inside the cluster's own namespace every port is free
_FIRST_UID = 65400  # member i runs as uid/gid _FIRST_UID + i (for partition rules)


@dataclass
class ClusterMember:
    index: int
    name: str
    base: Path
    client_port: int
    peer_port: int
    uid: int
    process: subprocess.Popen[bytes] | None = None
    id: int = 0  # etcd's member id, learnt from its status
    partitioned: bool = False

    @property
    def endpoint(self) -> str:
        """HOST:PORT inside the cluster's namespace."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def unix_endpoint(self) -> str:
        """gRPC target reaching this member from any namespace."""
        return f"unix:{self.base / SOCKET_NAME}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def log_path(self) -> Path:
        return self.base / "etcd.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __str__(self) -> str:
        return self.name


class EtcdCluster:
    def __init__(self, size: int = 3, *, request_timeout: float = 2.0) -> None:
        if not Path(ETCD_BINARY).exists():
            raise RuntimeError(f"{ETCD_BINARY} is missing (Debian's etcd-server)")
        token = uuid.uuid4().hex[:6]
        self.netns = f"pfec{token}"
        self.token = f"pyf-cluster-{token}"
        self.request_timeout = request_timeout
        # short: a unix socket path must stay under 108 bytes
        self.base = Path(tempfile.mkdtemp(prefix=f"pfec{token}-"))
        os.chmod(self.base, 0o711)  # the members' uids traverse it to their own directories
        self.members = [
            ClusterMember(i, f"m{i}", self.base / f"m{i}", _FIRST_PORT + 2 * i,
                          _FIRST_PORT + 2 * i + 1, _FIRST_UID + i)
            for i in range(size)]
        self._netns_created = False

    # -- addresses --

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def datastore_url(self, order: list[ClusterMember] | None = None) -> str:
        return "etcd3://" + ",".join(m.endpoint for m in (order or self.members))

    def unix_config(self, order: list[ClusterMember] | None = None,
                    request_timeout: float | None = None) -> EtcdConfig:
        """A client config for the test process (unix sockets), members in `order`."""
        return EtcdConfig(tuple(m.unix_endpoint for m in (order or self.members)), None,
                          request_timeout or self.request_timeout)

    # -- life cycle --

    def start(self, timeout: float = 30.0) -> None:
        subprocess.run(["ip", "netns", "add", self.netns], check=True)
        self._netns_created = True
        subprocess.run(["ip", "-n", self.netns, "link", "set", "lo", "up"], check=True)
        for member in self.members:
            self._spawn(member)
        for member in self.members:
            self.wait_healthy(member, timeout)

    def _spawn(self, member: ClusterMember) -> None:
        assert not member.running, f"{member} already running"
        member.base.mkdir(parents=True, exist_ok=True)
        os.chown(member.base, member.uid, member.uid)
        (member.base / SOCKET_NAME).unlink(missing_ok=True)  # left by a killed etcd
        args = [
            ETCD_BINARY, "--name", member.name, "--data-dir", str(member.base / "data"),
            "--listen-client-urls", f"http://{member.endpoint},unix://{SOCKET_NAME}",
            "--advertise-client-urls", f"http://{member.endpoint}",
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", self.initial_cluster, "--initial-cluster-state", "new",
            "--initial-cluster-token", self.token, "--logger", "zap", "--log-level", "warn",
        ]
        with open(member.log_path, "ab") as log:
            member.process = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, "setpriv", "--reuid", str(member.uid),
                 "--regid", str(member.uid), "--clear-groups", *DIE_WITH_PARENT[1:], *args],
                cwd=member.base,
                stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def wait_healthy(self, member: ClusterMember, timeout: float = 30.0) -> None:
        """Until `member` answers a linearizable read (it is part of a quorum with a
        leader) and has told its id."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert member.process is not None
            if member.process.poll() is not None:
                raise RuntimeError(f"etcd {member} exited with {member.process.returncode}:"
                                   f"\n{member.log_path.read_text()[-3000:]}")
            connection = EtcdConnection(member.unix_endpoint,
                                        EtcdConfig((member.unix_endpoint,), None, 0.5))
            try:
                connection.get(b"/health-probe")
                member.id = self.status(member)[0]
                return
            except (EtcdError, grpc.RpcError) as exc:
                last = exc
            finally:
                connection.close()
            time.sleep(0.05)
        raise RuntimeError(f"etcd {member} not healthy after {timeout} s: {last}\n"
                           f"{member.log_path.read_text()[-3000:]}")

    def kill(self, member: ClusterMember) -> None:
        if member.process is None:
            return
        if member.process.poll() is None:
            os.kill(member.process.pid, signal.SIGCONT)
            member.process.kill()
        member.process.wait(timeout=10)
        member.process = None

    def restart(self, *members: ClusterMember, timeout: float = 30.0) -> None:
        """Start `members` again on their data directories, all at once (so that members
        that together restore the quorum can become healthy), and wait for each."""
        for member in members:
            self.kill(member)
            self._spawn(member)
        for member in members:
            self.wait_healthy(member, timeout)

    def _partition_rules(self, member: ClusterMember) -> list[list[str]]:
        peer_ports = ",".join(str(m.peer_port) for m in self.members)
        return [
            # what the member sends to any peer port (it runs as its own uid)
            ["OUTPUT", "-m", "owner", "--uid-owner", str(member.uid), "-p", "tcp", "-m",
             "multiport", "--dports", peer_ports, "-j", "DROP"],
            # what anyone sends to the member's peer port
            ["INPUT", "-p", "tcp", "--dport", str(member.peer_port), "-j", "DROP"],
        ]

    def _iptables(self, *args: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.netns, "iptables", "-w", *args],
                       check=True, capture_output=True, timeout=30)

    def partition(self, member: ClusterMember) -> None:
        """Cut `member` off from its peers (iptables in the cluster's namespace: its own
        uid's packets to peer ports, and packets to its peer port, are dropped). Its
        clients still reach it: it keeps running and answering, without a quorum."""
        for rule in self._partition_rules(member):
            self._iptables("-I", *rule)
        member.partitioned = True

    def heal(self, member: ClusterMember) -> None:
        for rule in self._partition_rules(member):
            self._iptables("-D", *rule)
        member.partitioned = False

    def close(self) -> None:
        try:
            for member in self.members:
                self.kill(member)
        finally:
            if self._netns_created:
                subprocess.run(["ip", "netns", "del", self.netns], check=False)
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- who leads --

    def _maintenance(self, member: ClusterMember, call: str, request: object) -> object:
        channel = grpc.insecure_channel(member.unix_endpoint)
        try:
            stub = etcdrpc.MaintenanceStub(channel)
            return getattr(stub, call)(request, timeout=self.request_timeout)
        finally:
            channel.close()

    def status(self, member: ClusterMember) -> tuple[int, int]:
        """(this member's id, the leader's id as it knows it; 0 = none)."""
        response = self._maintenance(member, "Status", etcdrpc.StatusRequest())
        return int(response.header.member_id), int(response.leader)  # type: ignore[attr-defined]

    def by_id(self, member_id: int) -> ClusterMember:
        return next(m for m in self.members if m.id == member_id)

    def leader(self, timeout: float = 15.0) -> ClusterMember:
        """The running leader every running member agrees on (waits through an election)."""
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while time.monotonic() < deadline:
            try:
                seen = {self.status(m)[1] for m in self.members if m.running}
            except grpc.RpcError:
                seen = set()
            running = {m.id for m in self.members if m.running}
            if len(seen) == 1 and seen <= running:  # not a dead member's stale leadership
                return self.by_id(seen.pop())
            time.sleep(0.05)
        raise RuntimeError(f"the members do not agree on a leader: {seen}")

    def move_leader(self, to: ClusterMember) -> None:
        current = self.leader()
        if current is to:
            return
        self._maintenance(current, "MoveLeader", etcdrpc.MoveLeaderRequest(targetID=to.id))
        deadline = time.monotonic() + 15.0
        while self.leader() is not to:
            if time.monotonic() > deadline:
                raise RuntimeError(f"leadership did not move to {to}")
            time.sleep(0.05)
