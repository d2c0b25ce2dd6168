"""CalcPipeline on its own thread fed by a real FileSyncer, and the pass-through nodes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import yaml
from calc_testlib import (
    ALLOW,
    Replayer,
    block,
    felix_config,
    gnp,
    ip_pool,
    node,
    wep,
)

from pyfelix.agent import proto
from pyfelix.agent.calc import CalcPipeline, ExpectedDataplane
from pyfelix.agent.syncer.api import DatastoreError, RawUpdate, SyncStatus, key_of
from pyfelix.agent.syncer.file import FileSyncer


class LockedState(ExpectedDataplane):
    """The dataplane model, readable from the test thread while the pipeline writes."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def send(self, message: object) -> None:
        with self.lock:
            super().send(message)

    def endpoints(self) -> dict:
        with self.lock:
            return self.summary()["endpoints"]


def _wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_threaded_pipeline_follows_a_watched_directory(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump_all([
        wep("prod", "a", "node1", "10.65.0.1", labels={"app": "x"}),
        gnp("p1", "app == 'x'", ingress=[ALLOW])]))
    state = LockedState()
    pipeline = CalcPipeline("node1", state)
    syncer = FileSyncer(tmp_path, use_inotify=False, poll_interval=0.05, debounce=0.02)
    pipeline.start()
    syncer.start(pipeline)
    try:
        assert pipeline.wait_in_sync(10.0)
        assert state.endpoints() == {"prod/a": {"ingress": ["p1"], "egress": [],
                                                "profiles": []}}
        (tmp_path / "b.yaml").write_text(yaml.safe_dump(gnp("p0", "all()", order=1,
                                                            ingress=[ALLOW])))
        assert _wait_for(lambda: state.endpoints().get("prod/a", {}).get("ingress")
                         == ["p0", "p1"])
        (tmp_path / "a.yaml").unlink()
        assert _wait_for(lambda: state.endpoints() == {})
    finally:
        syncer.stop()
        pipeline.stop()
    assert state.in_sync and state.violations == []


def test_nothing_is_sent_before_in_sync() -> None:
    state = ExpectedDataplane()
    pipeline = CalcPipeline("node1", state)
    doc = wep("prod", "a", "node1", "10.65.0.1")
    pipeline.feed([RawUpdate(key_of(doc), doc, "t")], SyncStatus.RESYNC)
    assert state.messages == [] and not pipeline.in_sync.is_set()
    pipeline.feed([], SyncStatus.IN_SYNC)
    assert pipeline.in_sync.is_set()
    assert type(state.messages[-1]) is proto.InSync
    assert [type(m).__name__ for m in state.messages].count("WorkloadEndpointUpdate") == 1


def test_datastore_errors_are_kept_not_fatal() -> None:
    state = ExpectedDataplane()
    pipeline = CalcPipeline("node1", state)
    pipeline.on_error(DatastoreError("x.yaml#1", "bad"))
    pipeline.feed([], SyncStatus.IN_SYNC)
    assert [str(e) for e in pipeline.errors] == ["x.yaml#1: bad"]
    assert state.in_sync


def test_config_global_then_host_override() -> None:
    replayer = Replayer()
    replayer.go_to([felix_config("default", logSeverityScreen="Info", bpfEnabled=True),
                    felix_config("node.node1", logSeverityScreen="Debug"),
                    felix_config("node.node2", logSeverityScreen="Warning")])
    assert replayer.dataplane.config == {"bpfEnabled": "true", "logSeverityScreen": "Debug"}
    replayer.go_to([felix_config("default", logSeverityScreen="Info")])
    assert replayer.dataplane.config == {"logSeverityScreen": "Info"}
    configs = [m for m in replayer.dataplane.messages if isinstance(m, proto.ConfigUpdate)]
    assert len(configs) == 2


def test_host_ips_pools_and_route_details() -> None:
    replayer = Replayer()
    docs = [node("node1", "198.18.0.1"), node("node2", "198.18.0.2"),
            ip_pool("p", "10.65.0.0/16", ipipMode="Always", natOutgoing=True),
            wep("prod", "local", "node1", "10.65.0.3"),
            wep("prod", "far", "node2", "10.65.9.3"),
            block("b2", "node2", "10.65.1.0/26")]
    replayer.go_to(docs)
    dp = replayer.dataplane
    assert dp.host_ips == {"node1": "198.18.0.1", "node2": "198.18.0.2"}
    assert dp.pools["10.65.0.0/16"] == proto.IPAMPoolUpdate(
        id="10.65.0.0/16", cidr="10.65.0.0/16", masquerade=True, ipip_mode="Always")
    local = dp.routes["10.65.0.3/32"]
    assert (local.type, local.local_workload_iface, local.ip_pool_type, local.dst_node_ip) == (
        "local_workload", docs[3]["spec"]["interfaceName"], "ipip", "198.18.0.1")
    far = dp.routes["10.65.9.3/32"]  # outside node2's block: routed on its own
    assert (far.type, far.dst_node, far.dst_node_ip, far.nat_outgoing) == (
        "remote_workload", "node2", "198.18.0.2", True)
    assert dp.routes["10.65.1.0/26"].dst_node_ip == "198.18.0.2"
    # the remote node's address changes: its routes follow
    replayer.go_to([node("node1", "198.18.0.1"), node("node2", "198.18.0.22"), *docs[2:]])
    assert dp.routes["10.65.1.0/26"].dst_node_ip == "198.18.0.22"
    assert dp.routes["10.65.9.3/32"].dst_node_ip == "198.18.0.22"
    assert "198.18.0.2/32" not in dp.routes and dp.host_ips["node2"] == "198.18.0.22"
    # pool goes: routes lose their encapsulation
    replayer.go_to([node("node1", "198.18.0.1"), *docs[3:]])
    assert dp.routes["10.65.0.3/32"].ip_pool_type == ""
    assert dp.pools == {}


def test_same_destination_on_two_nodes_prefers_the_local_one() -> None:
    replayer = Replayer()
    here = wep("prod", "here", "node1", "10.65.0.50")
    there = wep("prod", "there", "node2", "10.65.0.50")
    replayer.go_to([there])
    assert replayer.dataplane.routes["10.65.0.50/32"].type == "remote_workload"
    replayer.go_to([there, here])
    assert replayer.dataplane.routes["10.65.0.50/32"].type == "local_workload"
    replayer.go_to([there])
    assert replayer.dataplane.routes["10.65.0.50/32"].type == "remote_workload"


def test_batch_callback_liveness_and_idleness() -> None:
    batches: list[tuple[float, int]] = []
    state = ExpectedDataplane()
    pipeline = CalcPipeline("node1", state, on_batch=lambda s, n: batches.append((s, n)))
    assert not pipeline.is_alive() and pipeline.idle()
    doc = wep("prod", "a", "node1", "10.65.0.1")
    pipeline.on_updates([RawUpdate(key_of(doc), doc, "t")])
    assert not pipeline.idle()
    pipeline.start()
    assert pipeline.is_alive()
    pipeline.on_status(SyncStatus.IN_SYNC)
    assert pipeline.wait_in_sync(10.0)
    assert _wait_for(pipeline.idle)
    pipeline.stop()
    assert not pipeline.is_alive() and pipeline.failure is None
    assert sum(n for _, n in batches) == len(state.messages) and all(s >= 0 for s, _ in batches)


def test_a_failing_dataplane_target_stops_the_thread_visibly() -> None:
    def broken(message: object) -> None:
        raise OSError("dataplane gone")

    pipeline = CalcPipeline("node1", broken)
    pipeline.start()
    pipeline.on_status(SyncStatus.IN_SYNC)
    try:
        pipeline.wait_in_sync(10.0)
    except RuntimeError as exc:
        assert isinstance(exc.__cause__, OSError)
    else:
        raise AssertionError("wait_in_sync did not report the failure")
    assert _wait_for(lambda: not pipeline.is_alive())
    assert isinstance(pipeline.failure, OSError)
    pipeline.stop()


def test_idle_pipeline_heartbeats_on_a_timer() -> None:
    beats: list[float] = []
    pipeline = CalcPipeline("node1", ExpectedDataplane(), heartbeat=lambda: beats.append(1.0),
                            heartbeat_interval=0.05)
    pipeline.start()
    try:
        assert _wait_for(lambda: len(beats) >= 6)  # nothing queued, ever
        pipeline.on_status(SyncStatus.IN_SYNC)
        assert pipeline.wait_in_sync(10.0)
    finally:
        pipeline.stop()


def test_heartbeats_stop_while_a_batch_hangs_and_resume_after() -> None:
    beats: list[float] = []
    release = threading.Event()
    hanging = threading.Event()

    def stuck_target(message: object) -> None:  # the flush never returns until released
        hanging.set()
        release.wait(10)

    pipeline = CalcPipeline("node1", stuck_target, heartbeat=lambda: beats.append(1.0),
                            heartbeat_interval=0.05)
    pipeline.start()
    try:
        pipeline.on_status(SyncStatus.IN_SYNC)
        assert hanging.wait(5)
        count = len(beats)
        time.sleep(0.3)
        assert len(beats) == count
        release.set()
        assert _wait_for(lambda: len(beats) >= count + 3)
    finally:
        release.set()
        pipeline.stop()


def test_cluster_information_ready_flag_and_cluster_settings() -> None:
    """ClusterInformation `default`: GUID/type/version join the global config (below the
    FelixConfigurations); datastoreReady false -> DatastoreReady(False), true again ->
    DatastoreReady(True); no message while it stays ready."""
    def cluster_info(**spec: object) -> dict[str, object]:
        return {"apiVersion": "projectcalico.org/v3", "kind": "ClusterInformation",
                "metadata": {"name": "default"}, "spec": spec}

    def readiness(replayer: Replayer) -> list[bool]:
        return [m.ready for m in replayer.dataplane.messages
                if isinstance(m, proto.DatastoreReady)]

    replayer = Replayer()
    replayer.go_to([cluster_info(datastoreReady=True, clusterGUID="abc", clusterType="k8s"),
                    felix_config("default", clusterType="override")])
    assert replayer.dataplane.config == {"ClusterGUID": "abc", "clusterType": "override",
                                         "ClusterType": "k8s"}
    assert readiness(replayer) == []
    replayer.go_to([cluster_info(datastoreReady=False, clusterGUID="abc"),
                    felix_config("default", clusterType="override")])
    assert readiness(replayer) == [False]
    replayer.go_to([cluster_info(datastoreReady=True, clusterGUID="abc"),
                    felix_config("default", clusterType="override")])
    assert readiness(replayer) == [False, True]


def test_ip_nats_become_the_endpoints_ipv4_nat_and_ipv6_nat() -> None:
    """A WorkloadEndpoint's ipNATs reach the dataplane split by IP version, as Felix's
    Ipv4Nat / Ipv6Nat; an update that drops the IPv6 one empties ipv6_nat only."""
    from calc_testlib import Replayer

    doc = wep("prod", "a", "node1", "10.65.0.1")
    doc["spec"]["ipNetworks"] = ["10.65.0.1/32", "fd65::1/128"]
    doc["spec"]["ipNATs"] = [{"internalIP": "fd65::1", "externalIP": "2001:db8::5"},
                             {"internalIP": "10.65.0.1", "externalIP": "192.0.2.5"}]
    replayer = Replayer()
    replayer.go_to([node("node1", "198.18.0.1"), doc])
    (endpoint,) = replayer.dataplane.workload_endpoints.values()
    assert endpoint.ipv4_nat == (proto.NatInfo(ext_ip="192.0.2.5", int_ip="10.65.0.1"),)
    assert endpoint.ipv6_nat == (proto.NatInfo(ext_ip="2001:db8::5", int_ip="fd65::1"),)
    changed = {**doc, "spec": {**doc["spec"], "ipNATs": doc["spec"]["ipNATs"][1:]}}
    replayer.go_to([node("node1", "198.18.0.1"), changed])
    (endpoint,) = replayer.dataplane.workload_endpoints.values()
    assert endpoint.ipv4_nat == (proto.NatInfo(ext_ip="192.0.2.5", int_ip="10.65.0.1"),)
    assert endpoint.ipv6_nat == ()
