"""Bad values in a REAL etcd are reported once, not once more per relist.

The syncer lists, is cut off, etcd is compacted meanwhile (written through the writer port,
see etcd_server.py), and the syncer relists when it comes back. The unchanged bad values
must not be reported (on_error, `pyfelix_datastore_parse_errors_total`) a second time; a bad
value changed while the syncer was cut off is reported once more. Unit tests with a fake
connection: tests/syncer_etcd/test_etcd_rejected_values.py.
"""

from __future__ import annotations

import pyetcd
import pytest
from prometheus_client import REGISTRY

from pyfelix.agent.syncer.api import SyncStatus
from pyfelix.agent.syncer.etcd_conn import EtcdConfig, EtcdConnection
from pyfelix.agent.syncer.etcd_keys import encode_value, etcd_key
from tests.privileged.etcd.conftest import SyncerFactory
from tests.privileged.etcd.etcd_server import EtcdServer
from tests.privileged.etcd.etcd_testlib import current_revision, gnp, gnp_key

pytestmark = pytest.mark.privileged

BAD_JSON = etcd_key(gnp_key("bad-json"))
BAD_KEY = "/calico/resources/v3/projectcalico.org/networkpolicies/no-namespace"
CHANGED = etcd_key(gnp_key("changed-while-away"))


def _parse_errors() -> float:
    return REGISTRY.get_sample_value("pyfelix_datastore_parse_errors_total",
                                     {"backend": "etcd3"}) or 0.0


def _put(config: EtcdConfig, key: str, value: bytes) -> None:
    connection = EtcdConnection(config.endpoints[0], config)
    try:
        connection.put(key.encode(), value)
    finally:
        connection.close()


def test_unchanged_bad_values_are_not_reported_again_by_a_relist(
        etcd: EtcdServer, start_syncer: SyncerFactory) -> None:
    writer = etcd.writer_config()
    _put(writer, etcd_key(gnp_key("good")), encode_value(gnp("good")))
    for key in (BAD_JSON, BAD_KEY, CHANGED):
        _put(writer, key, b"{not json")
    before = _parse_errors()
    _, recorder = start_syncer(etcd.config())
    recorder.wait_in_sync()
    assert sorted(e.source for e in recorder.errors) == sorted([BAD_JSON, BAD_KEY, CHANGED])
    assert _parse_errors() - before == 3
    relists = REGISTRY.get_sample_value("pyfelix_etcd_relists_total") or 0.0

    etcd.stop()
    recorder.wait_for(lambda r: r.statuses.count(SyncStatus.RESYNC) >= 2, "resync")
    etcd.start(syncer_port=False)
    _put(writer, CHANGED, b"[still not json")
    for i in range(5):  # revisions to compact away
        _put(writer, etcd_key(gnp_key("good")), encode_value(gnp("good", order=float(i))))
    host, port = etcd.writer_endpoint.split(":")
    with pyetcd.client(host, int(port)) as compactor:
        compactor.compact(current_revision(writer), physical=True)
    etcd.stop()
    etcd.start()
    recorder.wait_for(lambda r: r.statuses.count(SyncStatus.IN_SYNC) >= 2, "in sync again")

    assert (REGISTRY.get_sample_value("pyfelix_etcd_relists_total") or 0.0) == relists + 1
    assert [e.source for e in recorder.errors[3:]] == [CHANGED]
    assert _parse_errors() - before == 4
    assert recorder.state[gnp_key("good")]["spec"]["order"] == 4.0
