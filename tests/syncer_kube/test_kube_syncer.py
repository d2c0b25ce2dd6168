"""The Kubernetes datastore syncer: list, watch, 410 relist, bookmarks, broken streams.

No kube-apiserver can be installed on the test machines, so these tests run against an
in-process fake API server (tests/fakes_kube/server.py) that speaks the list/watch
protocol as the real one does: paged lists with resourceVersion and continue tokens,
chunked watch responses of JSON event lines (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR),
`410 Gone` as an ERROR event carrying a Status with code 410 when the requested
resourceVersion was compacted away, and bookmarks only for watches that ask for them.
The syncer reaches it through a kubeconfig file, as it would a real cluster.

No timing is asserted; the watch latency is printed (`pytest -s`) for the record.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from prometheus_client import REGISTRY

from pyfelix.agent.kinds import KIND_K8S_NETWORK_POLICY, ResourceType
from pyfelix.agent.syncer.api import ResourceKey, SyncStatus
from pyfelix.agent.syncer.kube_api import KubeAPI
from pyfelix.agent.syncer.kube_resources import RESOURCE_TYPES
from tests.fakes_kube.server import DEFAULT_TYPES, FakeCluster, FakeKubeAPIServer
from tests.syncer_kube.conftest import SyncerFactory

CRD = "crd.projectcalico.org/v1"


def _type(plural: str, group_version: str = "v1") -> ResourceType:
    return next(t for t in RESOURCE_TYPES if t.plural == plural
                and t.group_version == group_version)


PODS = _type("pods")
NAMESPACES = _type("namespaces")
GNPS = _type("globalnetworkpolicies", CRD)


def pod(name: str, node: str, ip: str, namespace: str = "shop") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


def crd_gnp(name: str, selector: str = "all()") -> dict[str, Any]:
    return {"apiVersion": CRD, "kind": "GlobalNetworkPolicy",
            "metadata": {"name": name, "labels": {"tier": "default"},
                         "annotations": {"projectcalico.org/metadata":
                                         '{"creationTimestamp": null}',
                                         "note": "kept"}},
            "spec": {"selector": selector, "order": 10}}


def pod_key(name: str, namespace: str = "shop") -> ResourceKey:
    return ResourceKey("Pod", namespace, name)


def gnp_key(name: str) -> ResourceKey:
    return ResourceKey("GlobalNetworkPolicy", "", name)


def _relists(resource: ResourceType) -> float:
    return REGISTRY.get_sample_value("pyfelix_kube_relists_total",
                                     {"resource": str(resource)}) or 0.0


def _resyncs(reason: str) -> float:
    return REGISTRY.get_sample_value("pyfelix_datastore_resyncs_total",
                                     {"backend": "kubernetes", "reason": reason}) or 0.0


def _lists(fake: FakeKubeAPIServer, path: str) -> list[dict[str, str]]:
    """The query of every list (GET without watch) of `path` the fake server received."""
    return [q for method, p, q in fake.requests
            if method == "GET" and p == path and "watch" not in q]


def _watches(fake: FakeKubeAPIServer, path: str) -> list[dict[str, str]]:
    """The query of every watch of `path` the fake server received."""
    return [q for method, p, q in fake.requests
            if method == "GET" and p == path and q.get("watch") == "true"]


def _populate(fake: FakeKubeAPIServer) -> None:
    cluster = fake.cluster
    cluster.put_object({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": "shop", "labels": {"team": "a"}}})
    cluster.put_object({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": "builder", "namespace": "shop"}})
    cluster.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
                        "status": {"addresses": [{"type": "InternalIP",
                                                  "address": "198.18.0.1"}]}})
    for i in range(5):
        cluster.put_object(pod(f"web-{i}", "node-a" if i % 2 else "node-b", f"10.65.0.{i + 1}"))
    cluster.put_object({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                        "metadata": {"name": "web", "namespace": "shop"},
                        "spec": {"podSelector": {}, "ingress": [{}]}})
    cluster.put_object(crd_gnp("deny-all"))
    cluster.put_object({"apiVersion": CRD, "kind": "NetworkPolicy",
                        "metadata": {"name": "allow-db", "namespace": "shop"},
                        "spec": {"selector": "app == 'db'"}})
    cluster.put_object({"apiVersion": CRD, "kind": "IPPool", "metadata": {"name": "pool-1"},
                        "spec": {"cidr": "10.65.0.0/16"}})


def _wait_in_sync_again(recorder: Any, count: int) -> None:
    recorder.wait_for(lambda r: r.statuses.count(SyncStatus.IN_SYNC) >= count
                      and r.statuses[-1] is SyncStatus.IN_SYNC, f"IN_SYNC #{count}")


def test_list_in_pages_converts_every_type(fake_kube: FakeKubeAPIServer,
                                           start_kube_syncer: SyncerFactory) -> None:
    _populate(fake_kube)
    _, recorder = start_kube_syncer(page_size=2)
    recorder.wait_in_sync()
    assert recorder.statuses == [SyncStatus.WAIT_FOR_DATASTORE, SyncStatus.RESYNC,
                                 SyncStatus.IN_SYNC]
    assert sorted(recorder.state) == sorted([
        ResourceKey("Namespace", "", "shop"), ResourceKey("ServiceAccount", "shop", "builder"),
        ResourceKey("Node", "", "node-a"), *(pod_key(f"web-{i}") for i in range(5)),
        ResourceKey(KIND_K8S_NETWORK_POLICY, "shop", "web"), gnp_key("deny-all"),
        ResourceKey("NetworkPolicy", "shop", "allow-db"), ResourceKey("IPPool", "", "pool-1")])
    # Kubernetes kinds: apiVersion/kind filled in (list items lack them), managedFields gone.
    web = recorder.state[pod_key("web-1")]
    assert web["apiVersion"] == "v1" and web["kind"] == "Pod"
    assert "managedFields" not in web["metadata"]
    assert web["status"]["podIP"] == "10.65.0.2"
    knp = recorder.state[ResourceKey(KIND_K8S_NETWORK_POLICY, "shop", "web")]
    assert knp["apiVersion"] == "networking.k8s.io/v1" and knp["kind"] == "NetworkPolicy"
    # Calico CRDs become v3 documents; Calico's metadata annotation is dropped.
    assert recorder.state[gnp_key("deny-all")] == {
        "apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
        "metadata": {"name": "deny-all", "labels": {"tier": "default"},
                     "annotations": {"note": "kept"}},
        "spec": {"selector": "all()", "order": 10}}
    assert recorder.state[ResourceKey("NetworkPolicy", "shop", "allow-db")]["metadata"] == {
        "name": "allow-db", "namespace": "shop"}
    # The pods were listed in pages of 2, following continue tokens.
    pod_lists = _lists(fake_kube, "/api/v1/pods")
    assert [q.get("limit") for q in pod_lists] == ["2", "2", "2"]
    assert [bool(q.get("continue")) for q in pod_lists] == [False, True, True]
    assert all(len(recorder.updates_of(key)) == 1 for key in recorder.state)
    assert recorder.errors == []


def test_watch_follows_changes_from_the_list_resource_version(
        fake_kube: FakeKubeAPIServer, start_kube_syncer: SyncerFactory) -> None:
    _populate(fake_kube)
    list_version = fake_kube.cluster.version
    syncer, recorder = start_kube_syncer()
    recorder.wait_in_sync()
    pod_watches = _watches(fake_kube, "/api/v1/pods")
    assert pod_watches[0]["resourceVersion"] == str(list_version)
    assert pod_watches[0]["allowWatchBookmarks"] == "true"

    latencies = []
    for i in range(20):
        before = time.monotonic()
        stored = fake_kube.cluster.put_object(pod(f"new-{i}", "node-c", f"10.65.1.{i}"))
        recorder.wait_for(lambda r, i=i: pod_key(f"new-{i}") in r.state, f"new-{i}")
        version = int(stored["metadata"]["resourceVersion"])
        latencies.append(recorder.arrival_of(pod_key(f"new-{i}"), version) - before)
    print(f"\nkubernetes watch latency (fake API server write -> update delivered), 20 "
          f"writes: median {statistics.median(latencies) * 1000:.1f} ms, "
          f"max {max(latencies) * 1000:.1f} ms")

    changed = pod("web-1", "node-a", "10.65.9.9")
    fake_kube.cluster.put_object(changed)
    fake_kube.cluster.delete_object("Pod", "v1", "web-2", "shop")
    fake_kube.cluster.put_object(crd_gnp("deny-all", selector="app == 'changed'"))
    recorder.wait_for(lambda r: pod_key("web-2") not in r.state
                      and r.state[pod_key("web-1")]["status"]["podIP"] == "10.65.9.9"
                      and r.state[gnp_key("deny-all")]["spec"]["selector"] == "app == 'changed'",
                      "modify + delete")
    last = recorder.updates_of(pod_key("web-2"))[-1]
    assert last.value is None
    assert int(syncer.resource_version(PODS)) >= int(last.revision)
    assert recorder.duplicates() == []
    assert recorder.statuses[-1] is SyncStatus.IN_SYNC


def test_410_gone_relists_with_the_right_deletes(fake_kube: FakeKubeAPIServer,
                                                 start_kube_syncer: SyncerFactory) -> None:
    _populate(fake_kube)
    _, recorder = start_kube_syncer(page_size=2, resync_settle=1.0)
    recorder.wait_in_sync()
    pod_relists, gnp_relists, ns_relists = _relists(PODS), _relists(GNPS), _relists(NAMESPACES)
    resyncs = _resyncs("expired")
    all_relists = sum(_relists(t) for t in RESOURCE_TYPES)
    namespace_updates = len(recorder.updates_of(ResourceKey("Namespace", "", "shop")))

    # While the syncer cannot watch: deletes, a change, a creation; then history is lost.
    fake_kube.partition()
    cluster = fake_kube.cluster
    cluster.delete_object("Pod", "v1", "web-0", "shop")
    cluster.delete_object("Pod", "v1", "web-3", "shop")
    cluster.put_object(pod("web-1", "node-a", "10.65.7.7"))
    cluster.put_object(pod("web-9", "node-b", "10.65.0.99"))
    cluster.delete_object("GlobalNetworkPolicy", CRD, "deny-all")
    cluster.put_object(pod("short-lived", "node-b", "10.65.0.98"))
    cluster.delete_object("Pod", "v1", "short-lived", "shop")
    cluster.compact()
    fake_kube.heal()

    _wait_in_sync_again(recorder, 2)
    # Every type relisted after the same outage: one RESYNC -> IN_SYNC for all of them,
    # and IN_SYNC came with the relisted state complete.
    assert recorder.statuses == [SyncStatus.WAIT_FOR_DATASTORE, SyncStatus.RESYNC,
                                 SyncStatus.IN_SYNC, SyncStatus.RESYNC, SyncStatus.IN_SYNC]
    state_at_in_sync = recorder.status_log[-1][2]
    assert pod_key("web-9") in state_at_in_sync and gnp_key("deny-all") not in state_at_in_sync
    assert _relists(PODS) == pod_relists + 1
    assert _relists(GNPS) == gnp_relists + 1
    assert _relists(NAMESPACES) == ns_relists + 1  # its watch was too old as well
    # the same relists, in the backend-wide metric
    assert _resyncs("expired") - resyncs == sum(_relists(t) for t in RESOURCE_TYPES) - all_relists
    assert recorder.state[pod_key("web-1")]["status"]["podIP"] == "10.65.7.7"
    for gone in (pod_key("web-0"), pod_key("web-3"), gnp_key("deny-all")):
        assert gone not in recorder.state
        assert recorder.updates_of(gone)[-1].value is None
    assert recorder.updates_of(pod_key("short-lived")) == []
    # Unchanged objects were not sent again by the relist.
    assert len(recorder.updates_of(ResourceKey("Namespace", "", "shop"))) == namespace_updates
    assert len(recorder.updates_of(pod_key("web-4"))) == 1
    assert recorder.duplicates() == []
    # And the new watches work.
    cluster.put_object(pod("after", "node-a", "10.65.0.50"))
    recorder.wait_for(lambda r: pod_key("after") in r.state, "write after relist")


def test_expired_continue_token_restarts_the_list(fake_kube: FakeKubeAPIServer,
                                                  start_kube_syncer: SyncerFactory) -> None:
    _populate(fake_kube)
    compactions: list[int] = []

    def compact_once_after_a_pod_page() -> None:
        if compactions:
            return
        if _lists(fake_kube, "/api/v1/pods"):
            fake_kube.cluster.put_object(pod("web-added-while-paging", "node-a", "10.65.0.77"))
            compactions.append(fake_kube.cluster.compact())

    fake_kube.after_list_page = compact_once_after_a_pod_page
    _, recorder = start_kube_syncer(page_size=2)
    recorder.wait_in_sync()
    assert compactions
    pod_lists = _lists(fake_kube, "/api/v1/pods")
    # The second page's token had expired: the list started over without a token.
    assert [bool(q.get("continue")) for q in pod_lists][:3] == [False, True, False]
    assert pod_key("web-added-while-paging") in recorder.state
    assert len([k for k in recorder.state if k.kind == "Pod"]) == 6
    assert recorder.duplicates() == []


def test_bookmarks_move_the_resume_point_and_avoid_a_relist(
        fake_kube: FakeKubeAPIServer, start_kube_syncer: SyncerFactory) -> None:
    _populate(fake_kube)
    syncer, recorder = start_kube_syncer()
    recorder.wait_in_sync()
    namespaces_version = syncer.resource_version(NAMESPACES)
    for i in range(5):  # cluster-wide resourceVersion moves on; namespaces see no event
        fake_kube.cluster.put_object(pod(f"more-{i}", "node-a", f"10.65.2.{i}"))
    recorder.wait_for(lambda r: pod_key("more-4") in r.state, "pods")
    assert syncer.resource_version(NAMESPACES) == namespaces_version

    current = fake_kube.cluster.version
    before = len(recorder.updates())
    fake_kube.send_bookmarks()
    recorder_deadline = time.monotonic() + 10
    while syncer.resource_version(NAMESPACES) != str(current):
        assert time.monotonic() < recorder_deadline, "bookmark not applied"
        time.sleep(0.01)
    assert len(recorder.updates()) == before  # a bookmark is not an update

    # History before the bookmark is dropped and the watches break: resuming from the
    # bookmark's resourceVersion needs no relist.
    relists = _relists(NAMESPACES)
    fake_kube.cluster.compact()
    fake_kube.break_watches()
    fake_kube.cluster.put_object({"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": "late"}})
    recorder.wait_for(lambda r: ResourceKey("Namespace", "", "late") in r.state, "late")
    assert _relists(NAMESPACES) == relists
    resumed = _watches(fake_kube, "/api/v1/namespaces")
    assert resumed[-1]["resourceVersion"] == str(current)
    assert recorder.duplicates() == []


def test_broken_stream_resumes_from_the_last_resource_version(
        fake_kube: FakeKubeAPIServer, start_kube_syncer: SyncerFactory) -> None:
    _populate(fake_kube)
    _, recorder = start_kube_syncer()
    recorder.wait_in_sync()
    stored = fake_kube.cluster.put_object(pod("before-break", "node-a", "10.65.3.1"))
    recorder.wait_for(lambda r: pod_key("before-break") in r.state, "before-break")
    fake_kube.break_watches()
    fake_kube.cluster.put_object(pod("after-break", "node-a", "10.65.3.2"))
    recorder.wait_for(lambda r: pod_key("after-break") in r.state, "after-break")
    resumed = _watches(fake_kube, "/api/v1/pods")
    assert stored["metadata"]["resourceVersion"] in [q["resourceVersion"] for q in resumed]
    assert recorder.statuses == [SyncStatus.WAIT_FOR_DATASTORE, SyncStatus.RESYNC,
                                 SyncStatus.IN_SYNC]
    assert recorder.duplicates() == []
    assert len(recorder.updates_of(pod_key("before-break"))) == 1


def test_a_type_the_server_does_not_serve_counts_as_empty(start_kube_syncer: SyncerFactory,
                                                           tmp_path: Any) -> None:
    without_tiers = FakeCluster(tuple(t for t in DEFAULT_TYPES if t.plural != "tiers"))
    server = FakeKubeAPIServer(without_tiers).start()
    try:
        api = KubeAPI.from_environment(kubeconfig=server.write_kubeconfig(
            str(tmp_path / "kc")))
        without_tiers.put_object(crd_gnp("g"))
        _, recorder = start_kube_syncer(api)
        recorder.wait_in_sync()
        assert gnp_key("g") in recorder.state
    finally:
        server.stop()


def test_wrong_credentials_keep_waiting_until_accepted(fake_kube: FakeKubeAPIServer,
                                                       start_kube_syncer: SyncerFactory,
                                                       tmp_path: Any) -> None:
    fake_kube.cluster.put_object(crd_gnp("g"))
    real_token = fake_kube.token
    fake_kube.token = "not-the-right-token"
    api = KubeAPI.from_environment(kubeconfig=fake_kube.write_kubeconfig(str(tmp_path / "k")))
    fake_kube.token = real_token  # the kubeconfig now holds a token the server refuses
    _, recorder = start_kube_syncer(api)
    time.sleep(0.5)
    assert recorder.statuses == [SyncStatus.WAIT_FOR_DATASTORE]
    assert recorder.state == {}
    fake_kube.token = "not-the-right-token"  # the server starts accepting it: retried
    recorder.wait_in_sync()
    assert gnp_key("g") in recorder.state


def test_services_and_endpoint_slices_are_listed_and_watched(
        fake_kube: FakeKubeAPIServer, start_kube_syncer: SyncerFactory) -> None:
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "web", "namespace": "shop"},
           "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "web"},
                    "ports": [{"port": 80, "targetPort": 8080}]}}
    fake_kube.cluster.put_object(svc)
    _, recorder = start_kube_syncer()
    recorder.wait_in_sync()
    got = recorder.state[ResourceKey("Service", "shop", "web")]
    assert got["apiVersion"] == "v1" and got["spec"]["clusterIP"] == "10.96.0.10"
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "web-x", "namespace": "shop",
                        "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4", "endpoints": [{"addresses": ["10.65.0.1"]}],
           "ports": [{"port": 8080}]}
    fake_kube.cluster.put_object(eps)
    key = ResourceKey("EndpointSlice", "shop", "web-x")
    recorder.wait_for(lambda r: key in r.state, "endpoint slice")
    assert recorder.state[key]["apiVersion"] == "discovery.k8s.io/v1"
    assert _watches(fake_kube, "/apis/discovery.k8s.io/v1/endpointslices")
