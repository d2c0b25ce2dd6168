"""The etcd3 syncer and client against a REAL etcd (Debian's etcd 3.4, started per test on
loopback; see etcd_server.py): list in pages, watch, bad values, endpoints, TLS, and the
same state as the file datastore for the same resources.

No timing is asserted here (speed targets live in benchmarks); the watch latency is
measured and printed (`pytest -s`) for the record.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from pyfelix.agent.syncer.api import ResourceKey, SyncStatus
from pyfelix.agent.syncer.client import DatastoreClientError, InvalidResources, ResourceNotFound
from pyfelix.agent.syncer.etcd_conn import EtcdConfig, EtcdConnection, EtcdTLS
from pyfelix.agent.syncer.etcd_keys import encode_value, etcd_key
from pyfelix.agent.syncer.etcd_store import EtcdDatastore
from pyfelix.agent.syncer.file import load_path
from pyfelix.lab.ports import free_port
from tests.privileged.etcd.conftest import ServerFactory, SyncerFactory
from tests.privileged.etcd.etcd_server import EtcdServer
from tests.privileged.etcd.etcd_testlib import (
    TimedRecorder,
    etcd_contents,
    gnp,
    gnp_key,
    namespace,
    netset,
    pod,
)

pytestmark = pytest.mark.privileged


def _put_raw(config: EtcdConfig, path: str, value: bytes) -> int:
    connection = EtcdConnection(config.endpoints[0], config)
    try:
        return connection.put(path.encode(), value)
    finally:
        connection.close()


def _settle(recorder: TimedRecorder, store: EtcdDatastore, marker: str) -> None:
    """Write a sentinel and wait for it: every earlier change has then been delivered."""
    store.apply([gnp(f"zz-sentinel-{marker}")])
    recorder.wait_for(lambda r: gnp_key(f"zz-sentinel-{marker}") in r.state,
                      f"sentinel {marker}")


def test_list_in_pages_then_watch(etcd: EtcdServer, start_syncer: SyncerFactory) -> None:
    store = EtcdDatastore(etcd.writer_config())
    docs = [gnp(f"policy-{i:02d}", order=float(i)) for i in range(10)]
    docs += [netset("db", "shop", ["10.1.0.0/16"]), namespace("shop"),
             pod("web-1", "shop", "node-a", "10.65.0.1")]
    assert {r.action for r in store.apply(docs)} == {"created"}

    syncer, recorder = start_syncer(etcd.config(), page_size=3)
    recorder.wait_in_sync()
    assert recorder.statuses == [SyncStatus.WAIT_FOR_DATASTORE, SyncStatus.RESYNC,
                                 SyncStatus.IN_SYNC]
    assert recorder.state == etcd_contents(etcd.writer_config())
    assert len(recorder.state) == 13
    assert ResourceKey("Pod", "shop", "web-1") in recorder.state
    assert all(len(recorder.updates_of(key)) == 1 for key in recorder.state)
    # The IN_SYNC status came after the whole list.
    status, _, state_then = recorder.status_log[-1]
    assert status is SyncStatus.IN_SYNC and len(state_then) == 13

    # Watch: create, modify, delete, each seen with its value; latency of raw puts.
    latencies = []
    for i in range(20):
        doc = gnp(f"watched-{i}", selector=f"app == 'x{i}'")
        before = time.monotonic()
        revision = _put_raw(etcd.writer_config(), etcd_key(gnp_key(f"watched-{i}")),
                            encode_value(doc))
        recorder.wait_for(lambda r, i=i: gnp_key(f"watched-{i}") in r.state, f"watched-{i}")
        latencies.append(recorder.arrival_of(gnp_key(f"watched-{i}"), revision) - before)
        assert recorder.state[gnp_key(f"watched-{i}")] == doc
    print(f"\netcd watch latency (put -> update delivered), 20 puts: median "
          f"{statistics.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms")

    changed = gnp("policy-03", selector="role == 'changed'")
    assert store.apply([changed])[0].action == "configured"
    store.delete(gnp_key("policy-04"))
    recorder.wait_for(lambda r: gnp_key("policy-04") not in r.state
                      and r.state[gnp_key("policy-03")] == changed, "modify + delete")

    # Re-applying an identical document writes nothing and sends nothing.
    before_count = len(recorder.updates())
    assert store.apply([changed])[0].action == "unchanged"
    _settle(recorder, store, "unchanged")
    assert [u.key for u in recorder.updates()[before_count:]] == [gnp_key("zz-sentinel-unchanged")]
    assert recorder.duplicates() == []
    assert recorder.errors == []
    assert syncer.revision > 0


def test_bad_values_are_reported_and_treated_as_deletes(
        etcd: EtcdServer, start_syncer: SyncerFactory) -> None:
    writer = etcd.writer_config()
    store = EtcdDatastore(writer)
    store.apply([gnp("good"), gnp("will-break")])
    _, recorder = start_syncer(etcd.config())
    recorder.wait_in_sync()

    broken_path = etcd_key(gnp_key("will-break"))
    _put_raw(writer, broken_path, b"{not json")
    recorder.wait_for(lambda r: gnp_key("will-break") not in r.state, "broken value deleted")
    assert any(e.source == broken_path and "not UTF-8 JSON" in e.message
               for e in recorder.errors)

    # A document whose own name disagrees with its key.
    _put_raw(writer, etcd_key(gnp_key("misnamed")), encode_value(gnp("other-name")))
    # A malformed key of a known kind, and a key of a kind pyfelix does not use.
    _put_raw(writer, "/calico/resources/v3/projectcalico.org/networkpolicies/only-a-name",
             encode_value(gnp("x")))
    _put_raw(writer, "/calico/resources/v3/projectcalico.org/ipamconfigs/default",
             b'{"kind": "IPAMConfig"}')
    _settle(recorder, store, "bad")
    messages = [e.message for e in recorder.errors]
    assert any("names GlobalNetworkPolicy(misnamed)" in m for m in messages), messages
    assert any("does not follow the layout" in m for m in messages), messages
    assert not any("ipamconfigs" in e.source for e in recorder.errors)
    assert gnp_key("misnamed") not in recorder.state
    assert gnp_key("other-name") not in recorder.state

    # Fixing the value brings the resource back.
    _put_raw(writer, broken_path, encode_value(gnp("will-break", selector="fixed == 'yes'")))
    recorder.wait_for(lambda r: gnp_key("will-break") in r.state, "fixed value")
    assert gnp_key("good") in recorder.state


def test_client_apply_validates_everything_before_writing(etcd: EtcdServer) -> None:
    store = EtcdDatastore(etcd.writer_config())
    bad_kind = {"apiVersion": "projectcalico.org/v3", "kind": "Nonsense",
                "metadata": {"name": "x"}}
    no_name = {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
               "metadata": {}}
    slash = gnp("a/b")
    with pytest.raises(InvalidResources) as caught:
        store.apply([gnp("fine"), bad_kind, no_name, slash, gnp("fine")],
                    sources=["in.yaml#1", "in.yaml#2", "in.yaml#3", "in.yaml#4", "in.yaml#5"])
    text = str(caught.value)
    assert "in.yaml#2" in text and "'Nonsense'" in text
    assert "in.yaml#3" in text and "metadata.name" in text
    assert "in.yaml#4" in text and "metadata.name 'a/b'" in text
    assert "in.yaml#5" in text and "appears twice" in text
    assert etcd_contents(etcd.writer_config()) == {}  # nothing written

    # A hook that rejects (the agent's validator in production) stops the write too.
    def reject_order(doc: object) -> None:
        raise ValueError("GlobalNetworkPolicy(fine): field 'spec.order' is negative")

    strict = EtcdDatastore(etcd.writer_config(), validate=reject_order)
    with pytest.raises(InvalidResources, match=r"spec\.order"):
        strict.apply([gnp("fine")])
    assert etcd_contents(etcd.writer_config()) == {}


def test_client_get_list_delete(etcd: EtcdServer) -> None:
    store = EtcdDatastore(etcd.writer_config())
    store.apply([gnp("b"), gnp("a"), netset("n1", "shop", ["10.0.0.0/8"]),
                 netset("n1", "prod", ["10.0.0.0/8"]), netset("n2", "shop", ["10.0.0.0/8"])])
    assert [d["metadata"]["name"] for d in store.get("GlobalNetworkPolicy")] == ["a", "b"]
    assert [d["metadata"]["namespace"] for d in store.get("NetworkSet", "n1")] == [
        "prod", "shop"]
    assert [d["metadata"]["name"] for d in store.get("NetworkSet", namespace="shop")] == [
        "n1", "n2"]
    assert store.get("GlobalNetworkPolicy", "missing") == []
    assert set(store.list()) == set(etcd_contents(etcd.writer_config()))
    store.delete(ResourceKey("NetworkSet", "shop", "n1"))
    assert [d["metadata"]["namespace"] for d in store.get("NetworkSet", "n1")] == ["prod"]
    with pytest.raises(ResourceNotFound, match=r"NetworkSet\(shop/n1\) not found"):
        store.delete(ResourceKey("NetworkSet", "shop", "n1"))
    with pytest.raises(DatastoreClientError, match="no etcd layout"):
        store.get("Nonsense")
    # Unreadable values are skipped with a warning naming the key.
    _put_raw(etcd.writer_config(), etcd_key(gnp_key("junk")), b"[1, 2]")
    assert [d["metadata"]["name"] for d in store.get("GlobalNetworkPolicy")] == ["a", "b"]
    assert [w.source for w in store.warnings] == [etcd_key(gnp_key("junk"))]


def test_endpoints_are_tried_in_turn(etcd: EtcdServer, start_syncer: SyncerFactory) -> None:
    dead = f"127.0.0.1:{free_port()}"
    store = EtcdDatastore(etcd.config(dead, etcd.writer_endpoint))
    assert store.apply([gnp("via-second-endpoint")])[0].action == "created"

    _, recorder = start_syncer(etcd.config(dead, etcd.endpoint))
    recorder.wait_in_sync()
    assert gnp_key("via-second-endpoint") in recorder.state

    nowhere = EtcdDatastore(etcd.config(dead, f"127.0.0.1:{free_port()}",
                                        request_timeout=0.5))
    with pytest.raises(DatastoreClientError, match="cannot reach etcd at") as caught:
        nowhere.get("GlobalNetworkPolicy")
    assert dead in str(caught.value)


def test_tls_with_client_certificates(make_etcd: ServerFactory,
                                      start_syncer: SyncerFactory) -> None:
    etcd = make_etcd(tls=True)
    store = EtcdDatastore(etcd.writer_config())
    store.apply([gnp("over-tls")])
    _, recorder = start_syncer(etcd.config())
    recorder.wait_in_sync()
    assert gnp_key("over-tls") in recorder.state

    assert etcd.tls is not None
    no_client_cert = EtcdConfig((etcd.writer_endpoint,), EtcdTLS(etcd.tls.ca_cert), 1.0)
    with pytest.raises(DatastoreClientError):
        EtcdDatastore(no_client_cert).get("GlobalNetworkPolicy")
    plain = EtcdConfig((etcd.writer_endpoint,), None, 1.0)
    with pytest.raises(DatastoreClientError):
        EtcdDatastore(plain).get("GlobalNetworkPolicy")


def test_waits_for_etcd_that_is_not_up_yet(make_etcd: ServerFactory,
                                           start_syncer: SyncerFactory) -> None:
    etcd = make_etcd(start=False)
    _, recorder = start_syncer(etcd.config())
    time.sleep(0.5)
    assert recorder.statuses == [SyncStatus.WAIT_FOR_DATASTORE]
    etcd.start()
    recorder.wait_in_sync()
    assert recorder.statuses == [SyncStatus.WAIT_FOR_DATASTORE, SyncStatus.RESYNC,
                                 SyncStatus.IN_SYNC]


_MIXED_RESOURCES = """\
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: deny-egress}
spec: {selector: "app == 'web'", order: 10, types: [Egress], egress: [{action: Deny}]}
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: allow-db, namespace: shop}
spec:
  selector: "app == 'db'"
  ingress: [{action: Allow, source: {selector: "app == 'web'"}}]
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: pool-1}
spec: {cidr: 10.65.0.0/16, natOutgoing: true}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: shop}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{from: [{podSelector: {}}]}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: builder, namespace: shop}
"""


def test_same_state_as_the_file_datastore(etcd: EtcdServer, start_syncer: SyncerFactory,
                                          tmp_path: Path) -> None:
    resources = tmp_path / "resources"
    resources.mkdir()
    (resources / "mixed.yaml").write_text(_MIXED_RESOURCES)
    pods = [pod(f"web-{i}", "shop", "node-a" if i % 2 else "node-b", f"10.65.0.{i}")
            for i in range(1, 6)]
    (resources / "pods.json").write_text("\n".join(json.dumps(p) for p in pods))
    file_updates, file_errors = load_path(str(resources))
    assert file_errors == []
    file_state = {u.key: u.value for u in file_updates}

    # Apply exactly what the file datastore holds, as `pyfelix apply -f DIR` does.
    store = EtcdDatastore(etcd.writer_config())
    store.apply([u.value or {} for u in file_updates], sources=[u.source for u in file_updates])
    _, recorder = start_syncer(etcd.config(), page_size=4)
    recorder.wait_in_sync()
    assert recorder.state == file_state
    assert ResourceKey("KubernetesNetworkPolicy", "shop", "web") in recorder.state
    assert store.list() == file_state
