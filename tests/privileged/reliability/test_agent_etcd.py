"""A running `pyfelix agent` (iptables mode) on the etcd3 datastore: etcd outages, an agent
started before etcd, and malformed documents written straight into etcd.

The world of each test, built by `etcd_agent_world()` and torn down on success, failure and
Ctrl-C (one ExitStack; etcd and the agent also get SIGKILL if pytest itself is killed,
which leaves only the namespace and a /tmp/pfet* directory behind):
- a network namespace `pfet<hex>` with one workload interface, a veth named as Calico's CNI
  names the host side of pod default/web (`cali` + 11 hex digits), its peer beside it;
- a real etcd (Debian's, see tests/privileged/etcd/etcd_server.py) started INSIDE that
  namespace: its client and peer ports are on the namespace's own 127.0.0.1, so nothing of
  it is reachable from the machine's network. The test itself writes through a unix socket
  etcd also listens on (`unix://writer:1`, created in etcd's working directory): the
  filesystem is shared between namespaces, the network is not;
- the agent, started with `ip netns exec` like the operators' DaemonSet runs it, with
  `--datastore etcd3://127.0.0.1:<port>`, health on 9099 and metrics on 9091 inside the
  namespace, its BPF pin directory a per-test directory on bpffs (removed at teardown).

1. `test_etcd_outage_keeps_the_dataplane_and_recovers`: with a policy programmed, etcd is
   killed for 10 s. Meanwhile the agent stays up, liveness AND readiness stay 200, and the
   whole programmed dataplane (every iptables table and the IP sets) stays exactly as it
   was; `felix_resync_state` shows the datastore resync (2). Readiness staying 200 is the
   documented behaviour of this agent (readiness = "the first in-sync has been reached and
   the dataplane is programmed", agent/health.py and agent/calc/pipeline.py: `in_sync` is
   set once and never cleared) and what Felix does in practice: Felix's calc graph reports
   ready only while its syncer says InSync, but libcalico-go's watcher syncer never leaves
   InSync once reached, so an etcd outage does not make calico-node unready either. After
   etcd restarts on the same data directory, a policy change written then is programmed
   within 30 s, the agent resumed its watch (no relist), and a delete is programmed too.
1b. `test_agent_started_before_etcd_waits_then_syncs`: the agent starts while nothing
   listens on etcd's port. It stays up, logs each retry with its growing delay, answers
   liveness 200 and readiness 503 (reporter `datastore` not ready); once etcd is started
   and written, the agent reads its configuration, becomes ready and programs the policy.
2. `test_malformed_documents_in_etcd_are_counted_and_change_nothing`: invalid JSON, a JSON
   array, a NetworkPolicy with a bad selector, a policy with a wrong-typed field, a document
   of an unknown kind under a known kind's directory, a key of the wrong shape, and a key of
   a kind pyfelix does not know, written raw (no `pyfelix apply` validation) beside a good
   policy. The agent does not exit; the good policy is untouched; the undecodable values
   and bad keys count once each in `pyfelix_datastore_parse_errors_total{backend="etcd3"}`,
   the decodable-but-invalid documents once each in `pyfelix_validation_errors_total`, and
   the unknown kind's key is ignored (counted nowhere), as agent/syncer/etcd.py documents.
   Later good changes (one a fix of a bad document) are programmed.

Figures printed (`-s` not needed): outage and recovery times.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyfelix.agent.conversion.k8s import workload_interface_name
from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.agent.syncer.etcd_conn import EtcdConnection
from pyfelix.agent.syncer.etcd_keys import decode_value, encode_value, etcd_key, parse_etcd_key
from pyfelix.agent.syncer.etcd_store import EtcdDatastore
from pyfelix.agent.validator import validate_document
from pyfelix.lab.netns import processes_in_netns
from tests.privileged.etcd.etcd_agent import (
    BPFFS,
    PEER_IFACE,
    EtcdAgent,
    base_documents,
    inbound_chain,
    web_policy,
)
from tests.privileged.etcd.etcd_agent import admits_port as _admits_port
from tests.privileged.etcd.etcd_agent import mount_bpffs_if_needed as _mount_bpffs_if_needed
from tests.privileged.etcd.etcd_server import DIE_WITH_PARENT, ETCD_BINARY, EtcdServer
from tests.privileged.etcd.etcd_testlib import CALICO
from tests.privileged.reliability.harness import (
    dataplane_snapshot,
    snapshot_difference,
    wait_for,
)

pytestmark = pytest.mark.privileged

WRITER_SOCKET = "writer:1"  # etcd's unix URL must look like host:port; the file gets that name
OUTAGE_SECONDS = 10.0
SYNC_TIMEOUT_S = 45.0
PROGRAM_TIMEOUT_S = 30.0
PARSE_ERRORS = "pyfelix_datastore_parse_errors_total"
VALIDATION_ERRORS = "pyfelix_validation_errors_total"
RESYNC_STATE = "felix_resync_state"
ETCD_RECONNECTS = "pyfelix_etcd_reconnects_total"
ETCD_RELISTS = "pyfelix_etcd_relists_total"
IN_SYNC, RESYNC = 3.0, 2.0  # felix_resync_state values
_COUNTERS = re.compile(r" \[\d+:\d+\]$")


# --- etcd inside the namespace --------------------------------------------------------------

class NamespacedEtcd(EtcdServer):
    """`EtcdServer` started inside `netns`: the code under test reaches it on the namespace's
    127.0.0.1:`client_port`; the test's own writes go through a unix socket in the server's
    directory (`writer_endpoint`), reachable from the root namespace without any network.
    Ports, data directory, stop/restart/close and the health wait are the parent's."""

    def __init__(self, base: Path, netns: str) -> None:
        super().__init__(base)
        self.netns = netns

    @property
    def writer_endpoint(self) -> str:
        return f"unix:{self.base / WRITER_SOCKET}"

    @property
    def datastore_url(self) -> str:
        return f"etcd3://{self.endpoint}"

    def start(self, *, syncer_port: bool = True, timeout: float = 20.0) -> None:
        assert self.process is None, "etcd already running"
        self.base.mkdir(parents=True, exist_ok=True)
        # a killed etcd leaves its socket file behind, and etcd will not bind over it
        (self.base / WRITER_SOCKET).unlink(missing_ok=True)
        urls = ([f"http://127.0.0.1:{self.client_port}"] if syncer_port else []) + [
            f"unix://{WRITER_SOCKET}"]
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        args = [
            ETCD_BINARY, "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", ",".join(urls),
            "--advertise-client-urls", f"http://127.0.0.1:{self.client_port}",
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self.name}={peer_url}", "--initial-cluster-state", "new",
            "--initial-cluster-token", self.name, "--logger", "zap", "--log-level", "warn",
        ]
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            # `ip netns exec` and setpriv both exec: the pid is etcd's own
            self.process = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, *DIE_WITH_PARENT, *args], cwd=self.base,
                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        self._wait_healthy(timeout)
        self.start_seconds = time.monotonic() - started


# --- the world ------------------------------------------------------------------------------

@dataclass
class World:
    netns: str
    iface: str
    etcd: NamespacedEtcd
    store: EtcdDatastore
    agent: EtcdAgent

    def raw_put(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Write raw values at raw etcd keys, in order, bypassing every client-side check."""
        connection = EtcdConnection(self.etcd.writer_endpoint, self.etcd.writer_config())
        try:
            for key, value in items:
                connection.put(key.encode(), value)
        finally:
            connection.close()

    def filter_table(self) -> str:
        done = subprocess.run(["ip", "netns", "exec", self.netns, "iptables-save", "-t",
                               "filter"], check=True, capture_output=True, text=True,
                              timeout=30)
        return done.stdout

    def chain_rules(self, chain: str) -> list[str] | None:
        """The rules of `chain` in the filter table (None: the chain does not exist)."""
        table = self.filter_table()
        if not re.search(rf"^:{re.escape(chain)} ", table, re.M):
            return None
        return [line for line in table.splitlines() if line.startswith(f"-A {chain} ")]

    def wait_until_settled(self, timeout: float = SYNC_TIMEOUT_S) -> dict[str, list[str]]:
        """Wait for an idle, in-sync agent whose dataplane snapshot no longer changes;
        returns that snapshot."""
        previous: list[dict[str, list[str]] | None] = [None]

        def settled() -> dict[str, list[str]] | None:
            self.agent.assert_running()
            status = self.agent.status()
            if not (status.get("dataplane_in_sync") and status.get("idle")):
                previous[0] = None
                return None
            snapshot = dataplane_snapshot(self.netns)
            stable = snapshot if snapshot == previous[0] else None
            previous[0] = snapshot
            return stable

        return wait_for(settled, timeout, "an idle agent with a stable dataplane", poll=0.3)


@contextlib.contextmanager
def etcd_agent_world(documents: Sequence[dict[str, Any]], *,
                     etcd_first: bool = True, felix_settings_only: bool = False
                     ) -> Iterator[World]:
    """Namespace + workload veth + etcd (inside it) holding `documents` + a running agent.
    With `etcd_first=False` the agent is started while etcd is NOT running yet (its port is
    chosen, nothing listens on it): the test starts etcd with `world.etcd.start()` and
    writes `documents` itself. Everything is undone on the way out, whatever the way out
    is. With `felix_settings_only` the agent has no --datastore: FELIX_DATASTORETYPE=etcdv3
    and FELIX_ETCDENDPOINTS name etcd, as for Felix."""
    if not Path(ETCD_BINARY).exists():
        pytest.fail(f"{ETCD_BINARY} is missing: install Debian's etcd-server (scripts/setup.sh)")
    token = uuid.uuid4().hex[:6]
    netns = f"pfet{token}"
    iface = workload_interface_name("default", "web")
    with contextlib.ExitStack() as undo:
        # A short base directory: a unix socket path must stay under 108 bytes.
        base = Path(tempfile.mkdtemp(prefix=f"pfet{token}-"))
        undo.callback(shutil.rmtree, base, ignore_errors=True)
        subprocess.run(["ip", "netns", "add", netns], check=True)
        undo.callback(subprocess.run, ["ip", "netns", "del", netns], check=False)
        for command in (["link", "set", "lo", "up"],
                        ["link", "add", iface, "type", "veth", "peer", "name", PEER_IFACE],
                        ["link", "set", iface, "up"], ["link", "set", PEER_IFACE, "up"]):
            subprocess.run(["ip", "-n", netns, *command], check=True)
        _mount_bpffs_if_needed()
        pin_dir = BPFFS / f"pfet{token}"
        pin_dir.mkdir()
        undo.callback(shutil.rmtree, pin_dir, ignore_errors=True)

        etcd = NamespacedEtcd(base, netns)
        undo.callback(etcd.close)
        store = EtcdDatastore(etcd.writer_config())
        undo.callback(store.close)
        if etcd_first:
            etcd.start()
            store.apply(list(documents))

        run_dir = base / "agent"
        run_dir.mkdir()
        if felix_settings_only:
            felix_env = {"FELIX_DATASTORETYPE": "etcdv3",
                         "FELIX_ETCDENDPOINTS": f"http://{etcd.endpoint}"}
            agent = EtcdAgent(netns, "", run_dir, pin_dir, felix_env=felix_env)
        else:
            agent = EtcdAgent(netns, etcd.datastore_url, run_dir, pin_dir)
        undo.callback(agent.stop)
        agent.start()
        yield World(netns, iface, etcd, store, agent)
    assert processes_in_netns(netns) == [], "processes left in the test's namespace"
    assert not pin_dir.exists()


# --- documents --------------------------------------------------------------------------------

def _wait_programmed(world: World, chain: str, port: int, what: str,
                     timeout: float = PROGRAM_TIMEOUT_S) -> float:
    """Wait until `chain` admits `port`; returns when it was first seen (monotonic)."""
    def check() -> bool:
        world.agent.assert_running()
        return _admits_port(world.chain_rules(chain), port)

    wait_for(check, timeout, what, poll=0.1)
    return time.monotonic()


def _wait_ready(world: World, chain: str, port: int) -> None:
    wait_for(lambda: (world.agent.assert_running(),
                      world.agent.http_status("/readiness") == 200)[1],
             SYNC_TIMEOUT_S, "readiness 200", poll=0.2)
    _wait_programmed(world, chain, port, f"{chain} admitting port {port}")


def _report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    with capsys.disabled():
        print(f"\n{line}")


# --- 1. etcd outage ------------------------------------------------------------------------------

@pytest.mark.timeout(150)
def test_etcd_outage_keeps_the_dataplane_and_recovers(
        root_guard: Any, capsys: pytest.CaptureFixture[str]) -> None:
    policy = web_policy("etcd-web", 80)
    chain = inbound_chain("etcd-web")
    with etcd_agent_world(base_documents(policy)) as world:
        agent = world.agent
        _wait_ready(world, chain, 80)
        before = world.wait_until_settled()
        assert agent.http_status("/liveness") == 200
        assert agent.metric(RESYNC_STATE) == IN_SYNC
        assert f"-j {chain}" in world.filter_table()  # the endpoint's chain jumps to it
        reconnects = agent.metric(ETCD_RECONNECTS)
        relists = agent.metric(ETCD_RELISTS)
        pid = agent.process.pid if agent.process else None

        # -- etcd goes away --
        killed_at = time.monotonic()
        world.etcd.stop()
        samples = 0
        resync_seen_after: float | None = None
        while time.monotonic() - killed_at < OUTAGE_SECONDS:
            agent.assert_running()
            assert agent.http_status("/liveness") == 200, "liveness lost during the outage"
            assert agent.http_status("/readiness") == 200, "readiness lost during the outage"
            if resync_seen_after is None and agent.metric(RESYNC_STATE) == RESYNC:
                resync_seen_after = time.monotonic() - killed_at
            during = dataplane_snapshot(world.netns)
            assert during == before, ("the dataplane changed while etcd was down:\n"
                                      + snapshot_difference(before, during))
            samples += 1
            time.sleep(0.5)
        assert resync_seen_after is not None, "felix_resync_state never showed the resync"
        assert agent.metric(RESYNC_STATE) == RESYNC
        assert samples >= 5

        # -- etcd comes back (same data directory); a change written right away --
        restarted_at = time.monotonic()
        world.etcd.start()
        answered_at = time.monotonic()
        world.store.apply([web_policy("etcd-web", 8080)])
        written_at = time.monotonic()
        seen: dict[str, float] = {}

        def recovered() -> bool:  # times are taken after each check: upper bounds
            agent.assert_running()
            if "in sync" not in seen and agent.metric(RESYNC_STATE) == IN_SYNC:
                seen["in sync"] = time.monotonic()
            if "programmed" not in seen and _admits_port(world.chain_rules(chain), 8080):
                seen["programmed"] = time.monotonic()
            return len(seen) == 2

        wait_for(recovered, PROGRAM_TIMEOUT_S,
                 "felix_resync_state 3 and the change written after the restart programmed")
        in_sync_at, programmed_at = seen["in sync"], seen["programmed"]
        assert not _admits_port(world.chain_rules(chain), 80)
        assert agent.metric(ETCD_RECONNECTS) > reconnects
        assert agent.metric(ETCD_RELISTS) == relists  # resumed the watch, no relist
        assert agent.http_status("/readiness") == 200

        # -- a delete after the restart --
        deleted_at = time.monotonic()
        world.store.delete(ResourceKey("GlobalNetworkPolicy", "", "etcd-web"))
        wait_for(lambda: world.chain_rules(chain) is None, PROGRAM_TIMEOUT_S,
                 f"{chain} removed after the policy's delete", poll=0.1)
        removed_at = time.monotonic()
        assert f"-j {chain}" not in world.filter_table()
        agent.assert_running()
        assert agent.process is not None and agent.process.pid == pid
        assert agent.http_status("/liveness") == 200
        assert "Traceback" not in agent.log_text(), agent.log_tail(60)
    root_guard.check()
    _report(capsys, (
        f"agent on etcd, {OUTAGE_SECONDS:.0f} s etcd outage: resync noticed "
        f"{resync_seen_after * 1000:.0f} ms after the kill; liveness/readiness 200 and "
        f"dataplane unchanged in {samples} samples; etcd restart took "
        f"{(answered_at - restarted_at) * 1000:.0f} ms; felix_resync_state 3 "
        f"{(in_sync_at - restarted_at) * 1000:.0f} ms after the restart began; change written "
        f"{(written_at - restarted_at) * 1000:.0f} ms "
        f"after the restart began was programmed {(programmed_at - written_at) * 1000:.0f} ms"
        f" later ({(programmed_at - restarted_at) * 1000:.0f} ms from the restart); delete "
        f"programmed in {(removed_at - deleted_at) * 1000:.0f} ms"))


# --- 1b. started before etcd ---------------------------------------------------------------------

WAIT_BEFORE_ETCD_S = 5.0


@pytest.mark.timeout(150)
def test_agent_started_before_etcd_waits_then_syncs(
        root_guard: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The agent's datastore is down when it starts (nothing listens on etcd's port yet):
    it keeps running, retries with growing delays and says so in its log, answers liveness
    200 and readiness 503 (the `datastore` reporter not ready) meanwhile; once etcd is
    started and holds a policy, the agent reads its configuration, syncs and programs it.
    (Before: the agent exited 2 at once with "cannot reach etcd".)"""
    policy = web_policy("late-etcd", 80)
    chain = inbound_chain("late-etcd")
    with etcd_agent_world(base_documents(policy), etcd_first=False) as world:
        agent = world.agent
        started_at = time.monotonic()
        readiness: list[int] = []
        while time.monotonic() - started_at < WAIT_BEFORE_ETCD_S:
            agent.assert_running()
            readiness.append(agent.http_status("/readiness"))
            time.sleep(0.25)
        agent.assert_running()
        assert agent.http_status("/liveness") == 200
        assert agent.http_status("/readiness") == 503
        assert 200 not in readiness, readiness
        body = agent.http_body("/readiness")
        datastore = body["reporters"]["datastore"]
        assert (datastore["live"], datastore["ready"]) == (True, False), body
        waits = [line for line in agent.log_text().splitlines()
                 if "is not reachable" in line and world.etcd.datastore_url in line]
        assert len(waits) >= 3, agent.log_tail(40)
        delays = [float(m.group(1)) for line in waits
                  if (m := re.search(r"next attempt in ([0-9.]+) s", line))]
        assert len(delays) == len(waits) and delays[-1] > delays[0], delays  # backing off
        assert world.chain_rules(chain) is None

        etcd_started_at = time.monotonic()
        world.etcd.start()
        world.store.apply(base_documents(policy))
        written_at = time.monotonic()
        _wait_ready(world, chain, 80)
        ready_at = time.monotonic()
        assert agent.http_body("/readiness")["reporters"]["datastore"]["ready"] is True
        assert "reachable after" in agent.log_text()
        assert agent.metric(RESYNC_STATE) == IN_SYNC
        assert "Traceback" not in agent.log_text(), agent.log_tail(60)
    root_guard.check()
    _report(capsys, (
        f"agent started {WAIT_BEFORE_ETCD_S:.0f} s before etcd: {len(waits)} logged retries "
        f"(delays {', '.join(f'{d:.1f}' for d in delays)} s), readiness 503 throughout; "
        f"etcd start + writes took {(written_at - etcd_started_at) * 1000:.0f} ms, ready and "
        f"programmed {(ready_at - written_at) * 1000:.0f} ms after the writes"))


# --- 2. malformed documents -----------------------------------------------------------------------

POLICIES = "/calico/resources/v3/projectcalico.org/globalnetworkpolicies/"
NAMESPACED_POLICIES = "/calico/resources/v3/projectcalico.org/networkpolicies/"


def _json(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def _bad_selector() -> dict[str, Any]:
    doc = web_policy("bad-selector", 82, kind="NetworkPolicy", namespace_name="default")
    doc["spec"]["selector"] = "app == 'web' &&"
    return doc


def _wrong_type() -> dict[str, Any]:
    doc = web_policy("wrong-type", 83)
    doc["spec"]["ingress"] = {"action": "Allow"}  # a mapping where a list of rules belongs
    return doc


# Undecodable at their key: the syncer reports each (parse error), the validator never sees it.
UNPARSEABLE: dict[str, tuple[str, bytes]] = {
    "invalid JSON": (POLICIES + "bad-json", b'{"kind": "GlobalNetworkPolicy", "metadata": '),
    "a JSON array": (POLICIES + "an-array", b'[{"kind": "GlobalNetworkPolicy"}]'),
    "an unknown kind under a known kind's directory": (POLICIES + "gadget", _json({
        "apiVersion": CALICO, "kind": "Gadget", "metadata": {"name": "gadget"},
        "spec": {"selector": "all()"}})),
    "a namespaced kind's key without a namespace": (NAMESPACED_POLICIES + "no-namespace",
                                                    _json(web_policy("no-namespace", 84))),
}
# Decodable and keyed right, rejected by the validator.
INVALID: dict[str, tuple[str, dict[str, Any]]] = {
    "a NetworkPolicy with a bad selector": (NAMESPACED_POLICIES + "default/bad-selector",
                                            _bad_selector()),
    "a wrong-typed field": (POLICIES + "wrong-type", _wrong_type()),
}
# Not in the layout at all (a Calico kind pyfelix does not use): skipped, counted nowhere.
IGNORED = ("/calico/resources/v3/projectcalico.org/gadgets/g1",
           _json({"apiVersion": CALICO, "kind": "Gadget", "metadata": {"name": "g1"}}))


def _check_the_inputs_are_what_they_claim() -> None:
    """Preconditions, so the counts asserted below mean what they say."""
    for what, (key, raw) in UNPARSEABLE.items():
        try:
            resource_key = parse_etcd_key(key)
            assert resource_key is not None, what
            decode_value(key, resource_key, raw)
        except ValueError:  # EtcdKeyError is a ValueError too
            continue
        raise AssertionError(f"{what} ({key}) decodes")
    for what, (key, doc) in INVALID.items():
        resource_key = parse_etcd_key(key)
        assert resource_key is not None
        assert decode_value(key, resource_key, _json(doc)) == doc, what
        with pytest.raises(Exception):  # noqa: B017 - any rejection will do
            validate_document(doc)
    assert parse_etcd_key(IGNORED[0]) is None


@pytest.mark.timeout(150)
def test_malformed_documents_in_etcd_are_counted_and_change_nothing(
        root_guard: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _check_the_inputs_are_what_they_claim()
    good_chain = inbound_chain("good")
    second_chain = inbound_chain("good-2")
    fixed_chain = inbound_chain("default/bad-selector")
    with etcd_agent_world(base_documents(web_policy("good", 80))) as world:
        agent = world.agent
        _wait_ready(world, good_chain, 80)
        world.wait_until_settled()
        good_rules = world.chain_rules(good_chain)
        parse_before = agent.metric(PARSE_ERRORS, backend="etcd3")
        invalid_before = agent.metric(VALIDATION_ERRORS)
        pid = agent.process.pid if agent.process else None

        # The bad ones first, then a good policy: etcd's watch delivers in revision order,
        # so once the good one is programmed every bad one has been through the agent.
        written_at = time.monotonic()
        world.raw_put([*UNPARSEABLE.values(),
                       *((key, _json(doc)) for key, doc in INVALID.values()),
                       IGNORED,
                       (etcd_key(ResourceKey("GlobalNetworkPolicy", "", "good-2")),
                        encode_value(web_policy("good-2", 81)))])
        programmed_at = _wait_programmed(world, second_chain, 81,
                                         "the good policy written after the bad ones")
        agent.assert_running()
        assert agent.metric(PARSE_ERRORS, backend="etcd3") - parse_before == len(UNPARSEABLE)
        assert agent.metric(VALIDATION_ERRORS) - invalid_before == len(INVALID)
        assert world.chain_rules(good_chain) == good_rules
        assert world.chain_rules(fixed_chain) is None
        assert world.chain_rules(inbound_chain("wrong-type")) is None
        assert agent.http_status("/readiness") == 200
        log = agent.log_text()
        for name in ("bad-selector", "wrong-type"):
            assert any("Invalid resource" in line and name in line
                       for line in log.splitlines()), f"no 'Invalid resource' line for {name}"
        for key, _ in UNPARSEABLE.values():
            assert key in log, f"no log line names {key}"
        assert "Internal error validating" not in log
        assert "failed unexpectedly" not in log

        # Later good changes: the good policy changes; a bad document is fixed.
        world.store.apply([web_policy("good", 8080),
                           web_policy("bad-selector", 82, kind="NetworkPolicy",
                                      namespace_name="default")])
        _wait_programmed(world, good_chain, 8080, "the good policy's change")
        _wait_programmed(world, fixed_chain, 82, "the fixed NetworkPolicy")
        assert not _admits_port(world.chain_rules(good_chain), 80)
        assert agent.metric(PARSE_ERRORS, backend="etcd3") - parse_before == len(UNPARSEABLE)
        assert agent.metric(VALIDATION_ERRORS) - invalid_before == len(INVALID)
        agent.assert_running()
        assert agent.process is not None and agent.process.pid == pid
        assert "Traceback" not in agent.log_text(), agent.log_tail(60)
    root_guard.check()
    _report(capsys, (
        f"agent on etcd, malformed documents: {len(UNPARSEABLE)} parse errors and "
        f"{len(INVALID)} validation errors counted exactly, 1 unknown-kind key ignored; "
        f"the good policy written after them programmed "
        f"{(programmed_at - written_at) * 1000:.0f} ms after the writes; agent restarts: 0"))


# --- 4. Felix's datastore settings alone ----------------------------------------------------------

@pytest.mark.timeout(120)
def test_agent_configured_only_as_felix_syncs_from_etcd(root_guard: Any) -> None:
    """No --datastore: FELIX_DATASTORETYPE=etcdv3 and FELIX_ETCDENDPOINTS=http://... only;
    the agent finds etcd, programs the policy and follows a change."""
    chain = inbound_chain("good")
    with etcd_agent_world(base_documents(web_policy("good", 80)),
                          felix_settings_only=True) as world:
        assert "--datastore" not in " ".join(world.agent.process.args)  # type: ignore[union-attr]
        _wait_ready(world, chain, 80)
        world.store.apply([web_policy("good", 8080)])
        _wait_programmed(world, chain, 8080, "the policy's change, through the watch")
        assert f"etcd3://{world.etcd.endpoint}" in world.agent.log_text()
        world.agent.assert_running()
    root_guard.check()
