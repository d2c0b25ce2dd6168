"""The etcd3 syncer through outages, against a REAL etcd (see etcd_server.py).

How "changes made meanwhile" are made faithfully: etcd listens on two client ports, one for
the syncer and one for the test's writer. During an outage etcd is killed; to change it
while the syncer is still cut off, the test restarts etcd on the WRITER port only (same
data directory, so revisions continue), writes and deletes, kills it again, and finally
restarts it on both ports. From the syncer's side etcd was simply down the whole time.

No timing is asserted; recovery times are printed (`pytest -s`) for the record.
"""

from __future__ import annotations

import time

import pyetcd
import pytest
from prometheus_client import REGISTRY

from pyfelix.agent.syncer.api import ResourceKey, SyncStatus
from pyfelix.agent.syncer.etcd_conn import EtcdConnection
from pyfelix.agent.syncer.etcd_keys import encode_value, etcd_key
from pyfelix.agent.syncer.etcd_store import EtcdDatastore
from tests.privileged.etcd.conftest import SyncerFactory
from tests.privileged.etcd.etcd_server import EtcdServer
from tests.privileged.etcd.etcd_testlib import (
    TimedRecorder,
    current_revision,
    etcd_contents,
    gnp,
    gnp_key,
    netset,
    pod,
)

pytestmark = pytest.mark.privileged

OUTAGE_SECONDS = 10.0


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _resyncs(reason: str) -> float:
    return _metric("pyfelix_datastore_resyncs_total", backend="etcd3", reason=reason)


def _wait_status(recorder: TimedRecorder, status: SyncStatus, occurrences: int,
                 timeout: float = 20.0) -> float:
    """Wait until `status` has been sent `occurrences` times; returns when it last was."""
    recorder.wait_for(lambda r: r.statuses.count(status) >= occurrences,
                      f"{status} x{occurrences}", timeout=timeout)
    return [when for s, when, _ in recorder.status_log if s is status][occurrences - 1]


def _initial(etcd: EtcdServer, start_syncer: SyncerFactory
             ) -> tuple[EtcdDatastore, TimedRecorder]:
    store = EtcdDatastore(etcd.writer_config())
    store.apply([*(gnp(name) for name in "abcdef"), netset("n1", "shop", ["10.2.0.0/16"]),
                 pod("p1", "shop", "node-a", "10.65.0.7")])
    _, recorder = start_syncer(etcd.config())
    recorder.wait_in_sync()
    return store, recorder


def test_ten_second_outage_resumes_without_loss_or_duplicates(
        etcd: EtcdServer, start_syncer: SyncerFactory) -> None:
    store, recorder = _initial(etcd, start_syncer)
    relists = _metric("pyfelix_etcd_relists_total")
    resyncs = _resyncs("compacted") + _resyncs("error")
    reconnects = _metric("pyfelix_etcd_reconnects_total")
    state_before = dict(recorder.state)

    killed_at = time.monotonic()
    etcd.stop()
    _wait_status(recorder, SyncStatus.RESYNC, 2)  # the start's RESYNC, then this one
    # Meanwhile (the syncer cannot reach etcd): deletes, a change and a creation.
    etcd.start(syncer_port=False)
    store.delete(gnp_key("b"))
    store.delete(ResourceKey("Pod", "shop", "p1"))
    changed = gnp("c", selector="changed == 'yes'")
    store.apply([changed, gnp("g")])
    expected = etcd_contents(etcd.writer_config())
    etcd.stop()
    time.sleep(max(0.0, killed_at + OUTAGE_SECONDS - time.monotonic()))
    assert recorder.state == state_before  # nothing seen while cut off
    assert recorder.last_status() is SyncStatus.RESYNC

    restarted_at = time.monotonic()
    etcd.start()
    in_sync_at = _wait_status(recorder, SyncStatus.IN_SYNC, 2)
    print(f"\netcd outage of {OUTAGE_SECONDS:.0f} s: back IN_SYNC "
          f"{(in_sync_at - restarted_at) * 1000:.0f} ms after etcd was started again, "
          f"of which etcd took {etcd.start_seconds * 1000:.0f} ms to answer the test's probe")

    # When IN_SYNC was sent, the state was already complete.
    _, _, state_at_in_sync = [entry for entry in recorder.status_log
                              if entry[0] is SyncStatus.IN_SYNC][1]
    assert state_at_in_sync == expected
    assert recorder.state == expected
    assert recorder.duplicates() == []
    for name in "adef":  # untouched: sent once, never again
        assert len(recorder.updates_of(gnp_key(name))) == 1
    assert [u.value for u in recorder.updates_of(gnp_key("b"))][-1] is None
    assert recorder.updates_of(ResourceKey("Pod", "shop", "p1"))[-1].value is None
    assert recorder.state[gnp_key("c")] == changed
    assert _metric("pyfelix_etcd_relists_total") == relists  # resumed, not relisted
    assert _resyncs("compacted") + _resyncs("error") == resyncs
    assert _metric("pyfelix_etcd_reconnects_total") > reconnects

    # And the watch goes on.
    store.apply([gnp("after")])
    recorder.wait_for(lambda r: gnp_key("after") in r.state, "write after recovery")
    assert recorder.errors == []


def test_compaction_while_cut_off_relists_with_the_right_deletes(
        etcd: EtcdServer, start_syncer: SyncerFactory) -> None:
    store, recorder = _initial(etcd, start_syncer)
    relists = _metric("pyfelix_etcd_relists_total")
    compacted = _resyncs("compacted")
    etcd.stop()
    _wait_status(recorder, SyncStatus.RESYNC, 2)

    etcd.start(syncer_port=False)
    writer = EtcdConnection(etcd.writer_endpoint, etcd.writer_config())
    try:
        for i in range(50):  # many revisions of one key
            writer.put(etcd_key(gnp_key("a")).encode(),
                       encode_value(gnp("a", selector=f"version == '{i}'")))
        writer.put(etcd_key(gnp_key("transient")).encode(), encode_value(gnp("transient")))
        writer.delete(etcd_key(gnp_key("transient")).encode())
        writer.delete(etcd_key(gnp_key("e")).encode())
        writer.delete(etcd_key(ResourceKey("NetworkSet", "shop", "n1")).encode())
        writer.put(etcd_key(gnp_key("new")).encode(), encode_value(gnp("new")))
    finally:
        writer.close()
    revision = current_revision(etcd.writer_config())
    host, port = etcd.writer_endpoint.split(":")
    with pyetcd.client(host, int(port)) as compactor:
        compactor.compact(revision, physical=True)
    expected = etcd_contents(etcd.writer_config())
    etcd.stop()

    restarted_at = time.monotonic()
    etcd.start()
    in_sync_at = _wait_status(recorder, SyncStatus.IN_SYNC, 2)
    print(f"\netcd compaction while cut off: relisted and IN_SYNC "
          f"{(in_sync_at - restarted_at) * 1000:.0f} ms after etcd was started again, of "
          f"which etcd took {etcd.start_seconds * 1000:.0f} ms to answer the test's probe")

    assert _metric("pyfelix_etcd_relists_total") == relists + 1
    assert _resyncs("compacted") == compacted + 1
    assert recorder.state == expected
    assert recorder.duplicates() == []
    # The relist sent only differences: the final value of "a", the deletes, the new key.
    assert len(recorder.updates_of(gnp_key("a"))) == 2
    assert recorder.state[gnp_key("a")]["spec"]["selector"] == "version == '49'"
    assert recorder.updates_of(gnp_key("transient")) == []
    assert recorder.updates_of(gnp_key("e"))[-1].value is None
    assert recorder.updates_of(ResourceKey("NetworkSet", "shop", "n1"))[-1].value is None
    for name in "bcdf":
        assert len(recorder.updates_of(gnp_key(name))) == 1
    store.apply([gnp("after")])
    recorder.wait_for(lambda r: gnp_key("after") in r.state, "write after relist")


def test_a_frozen_etcd_is_detected_by_the_liveness_probe(
        etcd: EtcdServer, start_syncer: SyncerFactory) -> None:
    store = EtcdDatastore(etcd.writer_config())
    store.apply([gnp("a")])
    _, recorder = start_syncer(etcd.config(request_timeout=0.5), liveness_interval=0.3,
                               liveness_timeout=0.3)
    recorder.wait_in_sync()
    reconnects = _metric("pyfelix_etcd_reconnects_total")
    frozen_at = time.monotonic()
    etcd.pause()  # SIGSTOP: connections stay open, nothing answers
    try:
        resync_at = _wait_status(recorder, SyncStatus.RESYNC, 2)
    finally:
        etcd.resume()
    print(f"\nfrozen etcd detected after {(resync_at - frozen_at) * 1000:.0f} ms "
          "(liveness interval 0.3 s + timeout 0.3 s)")
    _wait_status(recorder, SyncStatus.IN_SYNC, 2)
    assert _metric("pyfelix_etcd_reconnects_total") > reconnects
    store.apply([gnp("after-thaw")])
    recorder.wait_for(lambda r: gnp_key("after-thaw") in r.state, "write after thaw")
    assert recorder.duplicates() == []
