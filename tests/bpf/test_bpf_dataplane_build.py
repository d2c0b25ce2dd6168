"""The BPF dataplane builder's checks (clear DataplaneUnavailable messages) and the conntrack
cleanup manager, without a kernel."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import REGISTRY

from pyfelix.agent.bpf.conntrack import ConntrackCleaner
from pyfelix.agent.bpf.maps import conntrack as ct_map
from pyfelix.agent.bpf.maps.base import FakeMap
from pyfelix.agent.config import load_config
from pyfelix.agent.dataplane import bpf_dataplane
from pyfelix.agent.dataplane.errors import DataplaneUnavailable
from pyfelix.agent.dataplane.managers.bpf_conntrack import BpfConntrackManager

NS = 1_000_000_000


def config(**env: str):
    return load_config(environ={f"FELIX_{k.upper()}": v for k, v in env.items()})


def test_build_config_takes_map_sizes_and_pin_dir_from_felix_settings():
    build = bpf_dataplane.build_config(config(BPFPinDir="/sys/fs/bpf/x",
                                              BPFMapSizeRules="1000",
                                              BPFMapSizeConntrack="2000"))
    assert build.pin_dir == "/sys/fs/bpf/x"
    assert build.map_sizes["rules"] == 1000 and build.map_sizes["conntrack"] == 2000


def test_bad_map_size_names_the_parameter():
    with pytest.raises(DataplaneUnavailable, match="BPFMapSizeIPSets"):
        bpf_dataplane.build_config(config(BPFMapSizeIPSets="0"))


def test_pin_dir_off_bpffs_is_a_clear_unavailable_error(tmp_path):
    build = bpf_dataplane.build_config(config(BPFPinDir=str(tmp_path / "pins")))
    with pytest.raises(DataplaneUnavailable, match=r"no bpf filesystem.*BPFPinDir"):
        bpf_dataplane.load(build)


def _flow(ct: FakeMap, port: int, last_seen_ns: int, proto: int = 17) -> bytes:
    key, _ = ct_map.normalise(3, "10.0.0.1", "10.0.0.2", port, 53, proto)
    raw = ct_map.encode_key(key)
    ct.update(raw, ct_map.encode_value(ct_map.FlowValue(0, last_seen_ns, 1, 64, 0, 0)))
    return raw


def test_conntrack_cleanup_deletes_expired_flows_and_counts_them():
    ct = FakeMap(ct_map.PARAMS, max_entries=64)
    now = 1000 * NS
    fresh = _flow(ct, 1000, now - 5 * NS)  # UDP timeout 60 s
    _flow(ct, 1001, now - 61 * NS)
    _flow(ct, 1002, now - 600 * NS)
    m = BpfConntrackManager(lambda: ct, interval=10)
    before = REGISTRY.get_sample_value("pyfelix_bpf_conntrack_cleaned_total") or 0.0
    stats = m.run_once(ConntrackCleaner(ct, clock_ns=lambda: now))
    assert stats is not None and stats.deleted == 2 and stats.scanned == 3
    assert list(ct.data) == [fresh]
    assert REGISTRY.get_sample_value("pyfelix_bpf_conntrack_cleaned_total") == before + 2
    assert REGISTRY.get_sample_value("pyfelix_bpf_map_entries", {"map": "conntrack"}) == 1


def test_conntrack_cleanup_failure_is_counted_and_retried():
    ct = FakeMap(ct_map.PARAMS, max_entries=64)
    _flow(ct, 1000, 0)
    m = BpfConntrackManager(lambda: ct, interval=10)
    cleaner = ConntrackCleaner(ct, clock_ns=lambda: 1000 * NS)
    ct.fail_next = OSError(5, "EIO")
    assert m.run_once(cleaner) is None
    assert m.run_once(cleaner).deleted == 1


def test_conntrack_thread_runs_periodically_and_stops_on_close():
    ct = FakeMap(ct_map.PARAMS, max_entries=64)
    opened = threading.Event()

    def open_map() -> FakeMap:
        opened.set()
        return ct

    m = BpfConntrackManager(open_map, interval=0.01)
    released = []
    m.on_close = lambda: released.append(1)
    m.apply()
    assert opened.wait(5)
    for _ in range(500):
        if m.runs >= 2:
            break
        threading.Event().wait(0.01)
    m.close()
    assert m.runs >= 2 and released == [1]
    runs = m.runs
    threading.Event().wait(0.05)
    assert m.runs == runs  # stopped


def test_conntrack_interval_must_be_positive():
    with pytest.raises(ValueError, match="BPFConntrackCleanupInterval"):
        BpfConntrackManager(lambda: None, interval=0)
