"""Status reporting on fakes: endpoint statuses from the dataplane, the reporter's records in
a file datastore (TTL expiry, first_update, clean stop), and bad records read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyfelix.agent.dataplane.events import IFACE_ABSENT, InterfaceAddrsUpdate, InterfaceUpdate
from pyfelix.agent.dataplane.linux import LinuxDataplane
from pyfelix.agent.dataplane.managers.endpoint_status import EndpointStatusManager
from pyfelix.agent.datastore import DatastoreLocation, parse_datastore_url
from pyfelix.agent.proto import (
    HostEndpoint,
    HostEndpointID,
    HostEndpointRemove,
    HostEndpointUpdate,
    WorkloadEndpoint,
    WorkloadEndpointID,
    WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
)
from pyfelix.agent.status import StatusReporter, open_status_store
from pyfelix.agent.status.records import EndpointStatus, NodeStatus, StatusRecordError
from pyfelix.agent.status.stores import FileStatusStore, StatusStoreError, etcd_endpoint_key

WL = WorkloadEndpointID("k8s", "shop/web-1", "eth0")


def _wep(iface: str) -> WorkloadEndpointUpdate:
    return WorkloadEndpointUpdate(WL, WorkloadEndpoint(state="active", name=iface))


class Recorder:
    def __init__(self) -> None:
        self.state: dict[tuple[str, str], str] = {}
        self.calls = 0

    def __call__(self, kind: str, endpoint: str, status: str | None) -> None:
        self.calls += 1
        if status is None:
            del self.state[(kind, endpoint)]
        else:
            self.state[(kind, endpoint)] = status


def test_endpoint_statuses_follow_interfaces() -> None:
    rec = Recorder()
    mgr = EndpointStatusManager(rec)
    mgr.on_update(_wep("cali1"))
    mgr.apply()
    assert rec.state == {("workload", "k8s/shop/web-1/eth0"): "down"}
    mgr.on_update(InterfaceUpdate("cali1", 5, "up"))
    mgr.apply()
    assert rec.state[("workload", "k8s/shop/web-1/eth0")] == "up"
    calls = rec.calls
    mgr.on_update(InterfaceUpdate("eth9", 9, "up"))  # unrelated: nothing reported
    mgr.apply()
    assert rec.calls == calls
    mgr.on_update(InterfaceUpdate("cali1", 5, IFACE_ABSENT))
    mgr.apply()
    assert rec.state[("workload", "k8s/shop/web-1/eth0")] == "down"
    mgr.on_update(_wep("bad name!"))
    mgr.apply()
    assert rec.state[("workload", "k8s/shop/web-1/eth0")] == "error"
    mgr.on_update(WorkloadEndpointRemove(WL))
    mgr.apply()
    assert rec.state == {}


def test_host_endpoint_statuses() -> None:
    rec = Recorder()
    mgr = EndpointStatusManager(rec)
    for name, hep in (("by-name", HostEndpoint(name="eth0")), ("all", HostEndpoint(name="*")),
                      ("by-ip", HostEndpoint(name="", expected_ipv4_addrs=("198.18.0.1",)))):
        mgr.on_update(HostEndpointUpdate(HostEndpointID(name), hep))
    mgr.apply()
    assert rec.state == {("host", "by-name"): "down", ("host", "all"): "up",
                         ("host", "by-ip"): "down"}
    mgr.on_update(InterfaceUpdate("eth0", 2, "up"))
    mgr.on_update(InterfaceAddrsUpdate("eth0", frozenset({"198.18.0.1/15"})))
    mgr.apply()
    assert rec.state[("host", "by-name")] == "up" and rec.state[("host", "by-ip")] == "up"
    mgr.on_update(HostEndpointRemove(HostEndpointID("all")))
    mgr.apply()
    assert ("host", "all") not in rec.state


def test_linux_dataplane_adds_the_status_manager_last_only_when_asked() -> None:
    assert LinuxDataplane(netns="unused").loop.managers[-1].name == "sysctls"
    dp = LinuxDataplane(netns="unused", endpoint_status=Recorder())
    assert dp.loop.managers[-1].name == "endpoint-status"


class Clock:
    def __init__(self) -> None:
        self.wall = 1_000_000.0
        self.mono = 50.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def _reporter(tmp_path: Path, clock: Clock, **kw: object) -> StatusReporter:
    store = open_status_store(DatastoreLocation.file(tmp_path))
    assert isinstance(store, FileStatusStore)
    return StatusReporter(store, "node1", wall_clock=lambda: clock.wall,
                          monotonic=lambda: clock.mono, **kw)  # type: ignore[arg-type]


def test_node_record_first_update_uptime_in_sync_and_expiry(tmp_path: Path) -> None:
    clock = Clock()
    reporter = _reporter(tmp_path, clock, ttl=90.0, interval=30.0)
    reporter.tick()
    snap = FileStatusStore(tmp_path).read()
    assert [(n.hostname, n.first_update, n.in_sync, n.uptime) for n in snap.nodes] == [
        ("node1", True, False, 0.0)]
    assert (tmp_path / ".status" / "nodes" / "node1.json").exists()
    clock.advance(10)
    reporter.tick()  # not due yet: nothing written
    assert FileStatusStore(tmp_path).read().nodes[0].uptime == 0.0
    reporter.set_in_sync(True)
    reporter.tick()  # in-sync changed: written at once
    node = FileStatusStore(tmp_path).read().nodes[0]
    assert (node.first_update, node.in_sync, node.uptime) == (False, True, 10.0)
    clock.advance(31)
    reporter.tick()
    assert FileStatusStore(tmp_path).read().nodes[0].uptime == 41.0
    # the agent dies here: a reader sees the record expire once it is older than the TTL
    snap = FileStatusStore(tmp_path).read()
    assert not snap.nodes[0].expired(clock.wall + 89)
    assert snap.nodes[0].expired(clock.wall + 91)
    assert snap.live(clock.wall + 91).nodes == []


def test_endpoint_records_and_clean_stop(tmp_path: Path) -> None:
    clock = Clock()
    reporter = _reporter(tmp_path, clock, endpoint_reporting=True)
    reporter.on_endpoint_status("workload", "k8s/shop/web-1/eth0", "up")
    reporter.on_endpoint_status("host", "node1-eth0", "down")
    reporter.tick()
    snap = FileStatusStore(tmp_path).read()
    assert {(e.kind, e.endpoint, e.status) for e in snap.endpoints} == {
        ("workload", "k8s/shop/web-1/eth0", "up"), ("host", "node1-eth0", "down")}
    assert not any(snap.endpoint_expired(e, clock.wall) for e in snap.endpoints)
    assert all(snap.endpoint_expired(e, clock.wall + 91) for e in snap.endpoints)
    reporter.on_endpoint_status("host", "node1-eth0", None)
    reporter.tick()
    assert len(FileStatusStore(tmp_path).read().endpoints) == 1
    reporter.stop(clean=True)
    snap = FileStatusStore(tmp_path).read()
    assert snap.nodes == [] and snap.endpoints == []


def test_endpoint_reporting_off_writes_no_endpoint_records(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path, Clock())
    reporter.on_endpoint_status("workload", "k8s/a/b/eth0", "up")
    reporter.tick()
    assert FileStatusStore(tmp_path).read().endpoints == []


def test_write_failures_are_retried_not_fatal(tmp_path: Path) -> None:
    class Flaky(FileStatusStore):
        failures = 2

        def write_node(self, status: NodeStatus) -> None:
            if self.failures:
                self.failures -= 1
                raise StatusStoreError("disk full")
            super().write_node(status)

    clock = Clock()
    reporter = StatusReporter(Flaky(tmp_path), "node1", wall_clock=lambda: clock.wall,
                              monotonic=lambda: clock.mono)
    reporter.tick()
    clock.advance(1.0)
    reporter.tick()
    assert reporter.failures == 2 and FileStatusStore(tmp_path).read().nodes == []
    clock.advance(1.0)
    reporter.tick()
    assert FileStatusStore(tmp_path).read().nodes[0].first_update  # still the first one


def test_a_status_file_datastore_of_a_single_yaml_file(tmp_path: Path) -> None:
    datastore = tmp_path / "cluster.yaml"
    datastore.write_text("")
    store = open_status_store(DatastoreLocation.file(datastore))
    assert isinstance(store, FileStatusStore)
    assert store.root == tmp_path / ".cluster.yaml.status"


def test_unreadable_records_are_listed_not_fatal(tmp_path: Path) -> None:
    store = FileStatusStore(tmp_path)
    store.write_node(NodeStatus("node1", 1.0, 2.0, True, True, 90.0))
    (store.root / "nodes" / "bad.json").write_text("{not json")
    (store.root / "nodes" / "half.json").write_text(json.dumps({"hostname": "x"}))
    snap = store.read()
    assert [n.hostname for n in snap.nodes] == ["node1"]
    assert len(snap.problems) == 2 and "timestamp" in " ".join(snap.problems)


def test_bad_records_name_the_field() -> None:
    with pytest.raises(StatusRecordError, match="status"):
        EndpointStatus("n", "workload", "x", "sideways", 1.0)
    with pytest.raises(StatusRecordError, match="kind"):
        EndpointStatus("n", "pod", "x", "up", 1.0)
    with pytest.raises(ValueError, match="ReportingTTLSecs"):
        StatusReporter(FileStatusStore("/nonexistent"), "n", ttl=0)


def test_etcd_keys_follow_felix_layout() -> None:
    assert etcd_endpoint_key("node1", "workload", "k8s/shop/web-1/eth0") == (
        "/calico/felix/v2/no-region/host/node1/workload/k8s/shop%2fweb-1/endpoint/eth0")
    assert etcd_endpoint_key("node1", "host", "node1-eth0") == (
        "/calico/felix/v2/no-region/host/node1/endpoint/node1-eth0")


def test_no_status_store_for_kubernetes() -> None:
    assert open_status_store(parse_datastore_url("kubernetes")) is None


# --- pyfelix status ------------------------------------------------------------------------


def _cli(*args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from pyfelix.cli.main import cli

    result = CliRunner().invoke(cli, ["status", *args])
    return result.exit_code, result.output


def test_status_cli_shows_records_agent_file_and_checks(tmp_path: Path) -> None:
    import time

    store = FileStatusStore(tmp_path)
    now = time.time()
    store.write_node(NodeStatus("node1", now, 12.0, False, True, 90.0))
    store.write_node(NodeStatus("node2", now - 500, 3.0, True, False, 90.0))  # expired
    store.write_endpoint(EndpointStatus("node1", "workload", "k8s/shop/web-1/eth0", "up", now))
    status_file = tmp_path / "agent.json"
    status_file.write_text(json.dumps({"hostname": "node1", "dataplane": "iptables",
                                       "dataplane_in_sync": True, "written_wall": now}))
    code, out = _cli("--datastore", str(tmp_path), "--status-file", str(status_file),
                     "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert [(n["hostname"], n["expired"]) for n in data["nodes"]] == [("node1", False),
                                                                      ("node2", True)]
    assert data["endpoints"][0]["status"] == "up"
    assert data["agent"]["dataplane"] == "iptables" and data["problems"] == []
    code, out = _cli("--datastore", str(tmp_path))
    assert code == 0 and "node2" in out and "k8s/shop/web-1/eth0" in out
    assert _cli("--datastore", str(tmp_path), "--hostname", "node1", "--check")[0] == 0
    assert _cli("--datastore", str(tmp_path), "--hostname", "node2", "--check")[0] == 1
    assert _cli("--datastore", str(tmp_path), "--hostname", "node9", "--check")[0] == 1
    code, out = _cli("--status-file", str(tmp_path / "missing.json"))
    assert code == 0 and "problem: status file" in out
    assert _cli("--check")[0] != 0  # usage error: names what is missing
