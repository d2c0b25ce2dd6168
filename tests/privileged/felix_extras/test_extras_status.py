"""Status records in real datastores: they appear, and they expire when the agent stops.

A reporter process (`python -c`, the agent's `StatusReporter` with the store
`open_status_store(location)` picks, as the agent runs it) writes its node record and endpoint
records, then either stops cleanly (SIGTERM: records removed at once) or is SIGKILLed
(file: readers see the records expire after the TTL; etcd: the lease runs out and etcd
deletes them). Real etcd: Debian's etcd 3.4 on loopback (tests/privileged/etcd).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyfelix.agent.datastore import parse_datastore_url
from pyfelix.agent.status.stores import EtcdStatusStore, FileStatusStore, open_status_store
from tests.privileged.etcd.etcd_server import ETCD_BINARY, EtcdServer

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
TTL = 3.0
REPORTER = f"""
import signal, sys, threading
from pyfelix.agent.datastore import parse_datastore_url
from pyfelix.agent.status import StatusReporter, open_status_store
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
store = open_status_store(parse_datastore_url(sys.argv[1]), ttl={TTL})
reporter = StatusReporter(store, sys.argv[2], ttl={TTL},
                          interval=0.5, endpoint_reporting=True)
reporter.set_in_sync(True)
reporter.on_endpoint_status("workload", "k8s/shop/web-1/eth0", "up")
reporter.on_endpoint_status("host", sys.argv[2] + "-eth0", "down")
reporter.start()
print("started", flush=True)
stop.wait(60)
reporter.stop(clean=True)
"""


def start_reporter(datastore: str, hostname: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", REPORTER, datastore, hostname], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started", \
        proc.stderr.read() if proc.stderr else ""
    return proc


def wait_until(predicate, timeout: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    if not Path(ETCD_BINARY).exists():
        pytest.fail(f"{ETCD_BINARY} is missing: install Debian's etcd-server")
    server = EtcdServer(tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.close()


def _records(store: FileStatusStore | EtcdStatusStore, live: bool = False) -> dict[str, int]:
    snap = store.read()
    if live:
        snap = snap.live()
    return {"nodes": len(snap.nodes), "endpoints": len(snap.endpoints)}


def test_file_datastore_records_appear_and_expire(tmp_path: Path) -> None:
    store = FileStatusStore(tmp_path)
    clean = start_reporter(str(tmp_path), "node1")
    crashed = start_reporter(str(tmp_path), "node2")
    try:
        assert wait_until(lambda: _records(store, live=True) == {"nodes": 2, "endpoints": 4})
        node = store.read().node("node1")
        assert node is not None and node.in_sync and node.ttl == TTL
        clean.send_signal(signal.SIGTERM)
        assert clean.wait(10) == 0
        assert store.read().node("node1") is None  # a clean stop removes its records
        crashed.kill()
        crashed.wait(10)
        assert store.read().node("node2") is not None  # still there, but...
        assert wait_until(lambda: _records(store, live=True) == {"nodes": 0, "endpoints": 0},
                          timeout=TTL + 5)  # ...expired once older than the TTL
        assert not any(p.name.endswith(".yaml") for p in tmp_path.rglob("*"))
    finally:
        for proc in (clean, crashed):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_etcd_records_appear_and_go_with_the_lease(etcd: EtcdServer) -> None:
    url = f"etcd3://{etcd.endpoint}"
    store = open_status_store(parse_datastore_url(url))
    assert isinstance(store, EtcdStatusStore)
    clean = start_reporter(url, "node1")
    crashed = start_reporter(url, "node2")
    try:
        assert wait_until(lambda: _records(store) == {"nodes": 2, "endpoints": 4})
        node = store.read().node("node2")
        assert node is not None and node.in_sync and not node.expired()
        # alive for longer than the TTL: the lease is being kept alive
        time.sleep(TTL + 1)
        assert _records(store) == {"nodes": 2, "endpoints": 4}
        clean.send_signal(signal.SIGTERM)
        assert clean.wait(10) == 0
        assert _records(store) == {"nodes": 1, "endpoints": 2}  # lease revoked at once
        crashed.kill()
        crashed.wait(10)
        # etcd itself deletes the keys when the lease runs out (its minimum TTL may be
        # a few seconds longer than asked for)
        assert wait_until(lambda: _records(store) == {"nodes": 0, "endpoints": 0},
                          timeout=TTL + 10)
    finally:
        store.close()
        for proc in (clean, crashed):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_etcd_lease_lost_meanwhile_is_regranted_with_every_record(etcd: EtcdServer) -> None:
    """etcd forgot our lease (restored from backup, or we were paused past the TTL): the next
    node write grants a new lease and puts the endpoint records back too."""
    from pyfelix.agent.status.records import EndpointStatus, NodeStatus

    store = open_status_store(parse_datastore_url(f"etcd3://{etcd.endpoint}"), ttl=30)
    assert isinstance(store, EtcdStatusStore)
    reader = open_status_store(parse_datastore_url(f"etcd3://{etcd.endpoint}"))
    assert isinstance(reader, EtcdStatusStore)
    try:
        now = time.time()
        store.write_node(NodeStatus("node1", now, 1.0, True, True, 30.0))
        store.write_endpoint(EndpointStatus("node1", "workload", "k8s/a/b/eth0", "up", now))
        assert _records(reader) == {"nodes": 1, "endpoints": 1}
        # the lease goes behind our back (etcdctl): etcd drops both keys
        env = {"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"}
        etcdctl = ["etcdctl", f"--endpoints={etcd.writer_endpoint}"]
        listing = subprocess.run([*etcdctl, "lease", "list"], env=env, check=True,
                                 capture_output=True, text=True).stdout  # "found 1 leases\nID"
        leases = listing.splitlines()[1:]
        assert len(leases) == 1, listing
        subprocess.run([*etcdctl, "lease", "revoke", leases[0]], env=env, check=True,
                       capture_output=True)
        assert _records(reader) == {"nodes": 0, "endpoints": 0}
        store.write_node(NodeStatus("node1", time.time(), 2.0, False, True, 30.0))
        assert _records(reader) == {"nodes": 1, "endpoints": 1}
    finally:
        store.close()
        reader.close()
