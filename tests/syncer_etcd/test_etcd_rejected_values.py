"""The etcd syncer reports an unusable key or value once per revision, also across relists.

A relist (after a compaction, or a list that failed half-way and starts again) walks every
key under the prefix. It used to report every rejected value again, so
`pyfelix_datastore_parse_errors_total`, the log and `on_error` counted the same bad value
once per relist. These tests drive the syncer's list and watch handling with a stateful fake
of the etcd connection (a key -> (value, mod revision) map with a revision counter); the
protocol itself is tested against a real etcd in tests/privileged/etcd/.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from prometheus_client import REGISTRY

from pyfelix.agent.syncer.etcd import DELETE_EVENT, EtcdSyncer
from pyfelix.agent.syncer.etcd_conn import EtcdConfig
from pyfelix.agent.syncer.etcd_keys import encode_value, etcd_key
from tests.syncer.syncer_testlib import Recorder, gnp, gnp_key

GOOD = etcd_key(gnp_key("good")).encode()
BAD_JSON = etcd_key(gnp_key("bad-json")).encode()
BAD_KEY = b"/calico/resources/v3/projectcalico.org/networkpolicies/no-namespace"
WRONG_KIND = etcd_key(gnp_key("gadget")).encode()
NOT_OURS = b"/calico/resources/v3/projectcalico.org/ipamconfigs/default"
PUT_EVENT = 0


class FakeEtcd:
    """What the syncer's list and watch handling read: keys with mod revisions."""

    def __init__(self) -> None:
        self.revision = 1
        self.kvs: dict[bytes, tuple[bytes, int]] = {}

    def put(self, key: bytes, value: bytes) -> Any:
        self.revision += 1
        self.kvs[key] = (value, self.revision)
        return self._event(PUT_EVENT, key, value, self.revision)

    def delete(self, key: bytes) -> Any:
        self.revision += 1
        del self.kvs[key]
        return self._event(DELETE_EVENT, key, b"", self.revision)

    @staticmethod
    def _event(kind: int, key: bytes, value: bytes, revision: int) -> Any:
        kv = SimpleNamespace(key=key, value=value, mod_revision=revision)
        return SimpleNamespace(type=kind, kv=kv)

    # -- the EtcdConnection method `_list` calls --

    def range_pages(self, prefix: bytes, **_: Any) -> Iterator[tuple[int, list[Any]]]:
        kvs = [SimpleNamespace(key=key, value=value, mod_revision=revision)
               for key, (value, revision) in sorted(self.kvs.items())
               if key.startswith(prefix)]
        yield self.revision, kvs


def _response(*events: Any) -> Any:
    return SimpleNamespace(compact_revision=0, canceled=False, events=list(events))


def _parse_errors() -> float:
    return REGISTRY.get_sample_value("pyfelix_datastore_parse_errors_total",
                                     {"backend": "etcd3"}) or 0.0


def _syncer(fake: FakeEtcd) -> tuple[EtcdSyncer, Recorder]:
    syncer = EtcdSyncer(EtcdConfig(("127.0.0.1:2379",)))
    recorder = Recorder()
    syncer._callbacks = recorder  # as start() sets them, without the thread
    syncer._connection = fake  # type: ignore[assignment]
    return syncer, recorder


def _seed() -> FakeEtcd:
    fake = FakeEtcd()
    fake.put(GOOD, encode_value(gnp("good")))
    fake.put(BAD_JSON, b'{"kind": "GlobalNetworkPolicy", ')
    fake.put(BAD_KEY, encode_value(gnp("no-namespace")))
    fake.put(WRONG_KIND, encode_value({"apiVersion": "projectcalico.org/v3", "kind": "Gadget",
                                       "metadata": {"name": "gadget"}}))
    fake.put(NOT_OURS, b'{"kind": "IPAMConfig"}')
    return fake


def test_a_relist_does_not_report_unchanged_bad_values_again() -> None:
    fake = _seed()
    syncer, recorder = _syncer(fake)
    before = _parse_errors()
    syncer._list()
    assert sorted(e.source for e in recorder.errors) == sorted(
        k.decode() for k in (BAD_JSON, BAD_KEY, WRONG_KIND))
    assert _parse_errors() - before == 3
    assert set(recorder.state) == {gnp_key("good")}

    batches = len(recorder.batches)
    syncer._listed = False  # what a compaction does
    syncer._list()
    syncer._list()
    assert len(recorder.errors) == 3
    assert _parse_errors() - before == 3
    assert len(recorder.batches) == batches  # and nothing was sent either


def test_a_new_revision_of_a_bad_value_is_reported_again() -> None:
    fake = _seed()
    syncer, recorder = _syncer(fake)
    syncer._list()
    before = _parse_errors()
    fake.put(BAD_JSON, b"still [not json")  # changed while the syncer was cut off
    syncer._list()
    assert _parse_errors() - before == 1
    assert recorder.errors[-1].source == BAD_JSON.decode()

    # The same through the watch, then a relist that finds it unchanged.
    syncer._handle(_response(fake.put(BAD_JSON, b"nope")), None)
    assert _parse_errors() - before == 2
    syncer._list()
    assert _parse_errors() - before == 2


def test_a_deleted_bad_key_is_forgotten_and_a_fixed_one_sent() -> None:
    fake = _seed()
    syncer, recorder = _syncer(fake)
    syncer._list()
    before = _parse_errors()
    syncer._handle(_response(fake.delete(BAD_KEY)), None)
    fake.delete(WRONG_KIND)  # deleted while cut off: the relist forgets it
    syncer._list()
    assert syncer._rejected.keys() == {BAD_JSON}
    fake.put(WRONG_KIND, encode_value({"apiVersion": "projectcalico.org/v3", "kind": "Gadget",
                                       "metadata": {"name": "gadget"}}))
    syncer._list()  # back, bad again: a new revision, reported
    assert _parse_errors() - before == 1

    fake.put(BAD_JSON, encode_value(gnp("bad-json")))  # fixed
    syncer._list()
    assert gnp_key("bad-json") in recorder.state
    assert _parse_errors() - before == 1
    assert BAD_JSON not in syncer._rejected


def test_a_good_value_turned_bad_is_deleted_once_and_reported_once() -> None:
    fake = _seed()
    syncer, recorder = _syncer(fake)
    syncer._list()
    before = _parse_errors()
    syncer._handle(_response(fake.put(GOOD, b"{broken")), None)
    assert gnp_key("good") not in recorder.state
    deletes = [u for u in recorder.updates() if u.key == gnp_key("good") and u.value is None]
    assert len(deletes) == 1
    syncer._list()
    deletes = [u for u in recorder.updates() if u.key == gnp_key("good") and u.value is None]
    assert len(deletes) == 1
    assert _parse_errors() - before == 1
