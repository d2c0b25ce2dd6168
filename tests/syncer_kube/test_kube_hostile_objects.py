"""Hostile Kubernetes objects are rejected one object at a time; lists and watches go on.

Every object of a list page or watch event is checked (`agent.inputs.check_document`:
depth, members per list, size, duplicate keys) before anything copies it. A rejected object
is reported once per resourceVersion (naming kind, name, field, limit), counted in
`pyfelix_datastore_parse_errors_total{backend="kubernetes"}`, and handled as a delete of
its key. The JSON decoder of the API transport never raises RecursionError: a subtree too
deep to decode becomes a marker inside its own object, so one such object cannot take a
whole list page or watch stream down.
"""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace
from typing import Any

from prometheus_client import REGISTRY

from pyfelix.agent.syncer.kube import WatchOptions, _TypeWatcher
from pyfelix.agent.syncer.kube_api import WatchStream
from tests.fakes_kube.server import FakeKubeAPIServer
from tests.syncer_kube.conftest import SyncerFactory
from tests.syncer_kube.test_kube_syncer import CRD, GNPS, crd_gnp, gnp_key


def _parse_errors() -> float:
    return REGISTRY.get_sample_value("pyfelix_datastore_parse_errors_total",
                                     {"backend": "kubernetes"}) or 0.0


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def test_hostile_objects_are_skipped_reported_and_deleted(
        fake_kube: FakeKubeAPIServer, start_kube_syncer: SyncerFactory) -> None:
    cluster = fake_kube.cluster
    cluster.put_object(crd_gnp("good"))
    deep = crd_gnp("deep")
    deep["spec"]["types"] = _nested(150)
    cluster.put_object(deep)
    crowded = crd_gnp("crowded")
    crowded["spec"]["egress"] = [{"action": "Allow"}] * 100_001
    cluster.put_object(crowded)
    before = _parse_errors()

    _, recorder = start_kube_syncer(resource_types=[GNPS], page_size=2)
    recorder.wait_in_sync()
    assert set(recorder.state) == {gnp_key("good")}
    messages = sorted(e.message for e in recorder.errors)
    assert len(messages) == 2
    assert messages[0].startswith("GlobalNetworkPolicy(crowded): spec.egress: has 100001")
    assert messages[1].startswith("GlobalNetworkPolicy(deep): spec.types[0]")
    assert "max_nesting_depth" in messages[1]
    assert _parse_errors() - before == 2

    # A valid object turning hostile is a delete; fixed, it is back.
    bad = crd_gnp("good")
    bad["spec"]["selector"] = _nested(200)
    cluster.put_object(bad)
    recorder.wait_for(lambda r: gnp_key("good") not in r.state, "the delete")
    cluster.put_object(crd_gnp("good", selector="app == 'fixed'"))
    recorder.wait_for(lambda r: gnp_key("good") in r.state, "the fixed object")
    assert recorder.state[gnp_key("good")]["spec"]["selector"] == "app == 'fixed'"
    cluster.delete_object("GlobalNetworkPolicy", CRD, "deep")  # deleting one never sent
    assert _parse_errors() - before == 3


def test_a_200000_deep_object_in_a_watch_event_rejects_only_itself() -> None:
    depth = 200_000
    line = (b'{"type": "ADDED", "object": {"apiVersion": "crd.projectcalico.org/v1", '
            b'"kind": "GlobalNetworkPolicy", "metadata": {"name": "deep", '
            b'"resourceVersion": "7"}, "spec": {"selector": '
            + b"[" * depth + b"]" * depth + b"}}}")
    event = WatchStream(SimpleNamespace(), "watch test")._decode(line)  # was RecursionError
    assert event["type"] == "ADDED"

    reports: queue.Queue[Any] = queue.Queue()
    watcher = _TypeWatcher(GNPS, api=None, reports=reports,  # type: ignore[arg-type]
                           stop=threading.Event(), options=WatchOptions())
    watcher._handle(event)
    report = reports.get_nowait()
    assert report.what == "error"
    assert "GlobalNetworkPolicy(deep): spec.selector" in report.error.message
    assert watcher.resource_version == "7"  # the stream carries on from here
    assert reports.empty()
