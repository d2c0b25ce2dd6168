"""BpfNatManager over fake maps: contents, make-before-break order, a change touches only
its own keys, adoption of service ids after a restart, nothing deleted on partial
information, affinity cleanup, and fail-closed when the maps are full."""

from __future__ import annotations

import struct
from typing import Any

from pyfelix.agent import proto
from pyfelix.agent.bpf.maps import nat_affinity as aff_map
from pyfelix.agent.bpf.maps import nat_backend as be_map
from pyfelix.agent.bpf.maps import nat_frontend as fe_map
from pyfelix.agent.bpf.maps import nat_vip_filter as filter_map
from pyfelix.agent.bpf.maps.base import FakeMap
from pyfelix.agent.dataplane.managers.bpf_nat import BpfNatManager

B = proto.ServiceBackend


def frontend(vip: str, port: int, *backends: tuple[str, int], proto_: int = 6,
             affinity: int = 0, kind: str = "cluster") -> proto.ServiceFrontendUpdate:
    return proto.ServiceFrontendUpdate(
        id=f"{vip}:{port}/{proto_}", service="shop/web", port_name="", vip=vip, port=port,
        protocol=proto_, kind=kind, backends=tuple(B(a, p) for a, p in backends),
        affinity_timeout=affinity)


class Maps:
    def __init__(self, *, backends: int = 1000, frontends: int = 100) -> None:
        self.fe = FakeMap(fe_map.PARAMS, max_entries=frontends)
        self.be = FakeMap(be_map.PARAMS, max_entries=backends)
        self.aff = FakeMap(aff_map.PARAMS)
        self.filter = FakeMap(filter_map.PARAMS)
        self.filter.data = dict(filter_map.contents((), filter_map.PARAMS.max_entries))

    def manager(self) -> BpfNatManager:
        return BpfNatManager(self.fe, self.be, self.aff, self.filter)

    def filtered(self, vip: str) -> bool:
        bit = filter_map.bit_of(vip, filter_map.PARAMS.max_entries)
        word = self.filter.data[struct.pack("=I", bit // 64)]
        return bool(struct.unpack("=Q", word)[0] >> (bit % 64) & 1)

    def view(self) -> dict[tuple[str, int, str], dict[str, Any]]:
        out = {}
        backends = {be_map.decode_key(k): be_map.decode_value(v) for k, v in self.be.data.items()}
        for k, v in self.fe.data.items():
            key, value = fe_map.decode_key(k), fe_map.decode_value(v)
            sid = value["service_id"]
            listed = [backends[(sid, i)] for i in range(value["backends"])]
            # the frontend's inline copy is always nat_backend's first indexes
            assert value["inline_backends"] == listed[:fe_map.INLINE_BACKENDS]
            out[(key["vip"], key["port"], key["protocol"])] = {
                "sid": sid, "count": value["backends"], "flags": value["flags"],
                "backends": listed}
        return out


def test_contents_and_a_change_touches_only_its_own_frontend() -> None:
    maps = Maps()
    m = maps.manager()
    web = frontend("10.96.0.10", 80, ("10.65.0.1", 8080), ("10.65.0.2", 8080), affinity=60)
    dns = frontend("10.96.0.53", 53, ("10.65.0.3", 5353), proto_=17)
    for msg in (web, dns, proto.InSync()):
        m.on_update(msg)
    m.apply()
    view = maps.view()
    assert view[("10.96.0.10", 80, "tcp")]["backends"] == [("10.65.0.1", 8080),
                                                          ("10.65.0.2", 8080)]
    assert view[("10.96.0.10", 80, "tcp")]["flags"] == ["affinity"]
    assert view[("10.96.0.53", 53, "udp")]["count"] == 1
    sids = {v["sid"] for v in view.values()}
    assert len(sids) == 2 and 0 not in sids
    # same state again: nothing written
    writes = (maps.fe.writes, maps.be.writes)
    m.on_update(web)
    m.apply()
    assert (maps.fe.writes, maps.be.writes) == writes
    # web loses a backend: one frontend write, one backend delete, dns untouched
    m.on_update(frontend("10.96.0.10", 80, ("10.65.0.1", 8080), affinity=60))
    m.apply()
    assert (maps.fe.writes - writes[0], maps.be.writes - writes[1]) == (1, 1)
    assert maps.view()[("10.96.0.10", 80, "tcp")]["backends"] == [("10.65.0.1", 8080)]
    assert maps.view()[("10.96.0.53", 53, "udp")] == view[("10.96.0.53", 53, "udp")]


def test_growing_writes_backends_before_the_count_and_shrinking_deletes_after() -> None:
    maps = Maps()
    m = maps.manager()
    m.on_update(proto.InSync())
    m.on_update(frontend("10.96.0.10", 80, ("10.65.0.1", 80)))
    m.apply()
    order: list[str] = []
    fe_update, be_update, be_delete = maps.fe.update, maps.be.update, maps.be.delete
    maps.fe.update = lambda k, v, f=0: (order.append("fe"), fe_update(k, v))[1]  # type: ignore
    maps.be.update = lambda k, v, f=0: (order.append("be+"), be_update(k, v))[1]  # type: ignore
    maps.be.delete = lambda k: (order.append("be-"), be_delete(k))[1]  # type: ignore
    m.on_update(frontend("10.96.0.10", 80, ("10.65.0.1", 80), ("10.65.0.2", 80)))
    m.apply()
    assert order == ["be+", "fe"]
    order.clear()
    m.on_update(frontend("10.96.0.10", 80, ("10.65.0.1", 80)))
    m.apply()
    assert order == ["fe", "be-"]


def test_no_backends_is_count_zero_and_remove_deletes_everything() -> None:
    maps = Maps()
    m = maps.manager()
    m.on_update(frontend("10.96.0.11", 80))
    m.apply()
    assert maps.view()[("10.96.0.11", 80, "tcp")]["count"] == 0
    m.on_update(frontend("10.96.0.10", 80, ("10.65.0.1", 80)))
    m.apply()
    m.on_update(proto.ServiceFrontendRemove("10.96.0.10:80/6"))
    m.apply()  # before InSync too: this run programmed it
    assert list(maps.view()) == [("10.96.0.11", 80, "tcp")] and maps.be.data == {}


def test_restart_adopts_ids_and_deletes_unknown_entries_only_after_in_sync() -> None:
    maps = Maps()
    first = maps.manager()
    for msg in (frontend("10.96.0.10", 80, ("10.65.0.1", 80)),
                frontend("10.96.0.12", 80, ("10.65.0.5", 80)), proto.InSync()):
        first.on_update(msg)
    first.apply()
    before = maps.view()
    second = maps.manager()  # a restarted agent: the pinned maps stay
    second.on_update(frontend("10.96.0.12", 80, ("10.65.0.5", 80), ("10.65.0.6", 80)))
    second.apply()
    after = maps.view()
    assert after[("10.96.0.12", 80, "tcp")]["sid"] == before[("10.96.0.12", 80, "tcp")]["sid"]
    assert after[("10.96.0.10", 80, "tcp")] == before[("10.96.0.10", 80, "tcp")]  # kept
    second.on_update(proto.InSync())
    second.apply()
    assert list(maps.view()) == [("10.96.0.12", 80, "tcp")]
    assert {be_map.decode_key(k)[0] for k in maps.be.data} == {
        before[("10.96.0.12", 80, "tcp")]["sid"]}


def test_affinity_entries_to_removed_backends_are_deleted() -> None:
    maps = Maps()
    m = maps.manager()
    m.on_update(proto.InSync())
    m.on_update(frontend("10.96.0.10", 80, ("10.65.0.1", 80), ("10.65.0.2", 80), affinity=30))
    m.on_update(frontend("10.96.0.20", 80, ("10.65.0.2", 80), affinity=30))
    m.apply()
    ids = m.service_ids()
    web, other = ids["10.96.0.10:80/6"], ids["10.96.0.20:80/6"]
    for sid, client, backend in ((web, "10.65.1.1", "10.65.0.1"), (web, "10.65.1.2", "10.65.0.2"),
                                 (other, "10.65.1.2", "10.65.0.2")):
        maps.aff.update(aff_map.encode_key(sid, client), aff_map.encode_value(backend, 80, 1))
    m.on_update(frontend("10.96.0.10", 80, ("10.65.0.1", 80), affinity=30))
    m.apply()
    assert {aff_map.decode_key(k) for k in maps.aff.data} == {(web, "10.65.1.1"),
                                                               (other, "10.65.1.2")}


def test_full_backend_map_rejects_that_frontend_only() -> None:
    maps = Maps(backends=3)
    m = maps.manager()
    m.on_update(proto.InSync())
    m.on_update(frontend("10.96.0.10", 80, ("10.65.0.1", 80), ("10.65.0.2", 80)))
    m.on_update(frontend("10.96.0.20", 80, ("10.65.0.3", 80), ("10.65.0.4", 80)))
    m.apply()
    counts = {k[0]: v["count"] for k, v in maps.view().items()}
    assert sorted(counts.values()) == [0, 2]  # one fits, the other rejects (fail closed)
    assert m.problems and "do not fit in nat_backend" in m.problems[0]


def test_vip_filter_bit_is_set_before_the_frontend_and_cleared_after_it() -> None:
    maps = Maps()
    m = maps.manager()
    m.on_update(proto.InSync())
    order: list[str] = []
    fe_update, fe_delete, filter_update = maps.fe.update, maps.fe.delete, maps.filter.update

    def spy_filter(k: bytes, v: bytes, f: int = 0) -> None:
        order.append(f"filter:{maps.filtered('10.96.0.10')}->")
        filter_update(k, v)
        order[-1] += str(maps.filtered("10.96.0.10"))

    maps.fe.update = lambda k, v, f=0: (order.append("fe+"), fe_update(k, v))[1]  # type: ignore
    maps.fe.delete = lambda k: (order.append("fe-"), fe_delete(k))[1]  # type: ignore
    maps.filter.update = spy_filter  # type: ignore
    m.on_update(frontend("10.96.0.10", 80, ("10.65.0.1", 80)))
    m.apply()
    assert order == ["filter:False->True", "fe+"] and maps.filtered("10.96.0.10")
    order.clear()
    m.on_update(proto.ServiceFrontendRemove("10.96.0.10:80/6"))
    m.apply()
    assert order == ["fe-", "filter:True->False"] and not maps.filtered("10.96.0.10")


def test_nat_drops_are_in_the_drop_metric() -> None:
    from pyfelix.agent.dataplane.managers.bpf_metrics import DropCollector

    collector = DropCollector()
    collector.set_sources(global_counters=lambda: {"policy_denied": 2}, guard=None,
                          spoofed_by_endpoint=None,
                          nat=lambda: {"rejected": 3, "xlate_failed": 1, "new_flows": 9})
    drops = next(iter(collector.collect()))
    values = {s.labels["reason"]: s.value for s in drops.samples}
    assert values["service_without_endpoints"] == 3 and values["service_nat_failed"] == 1
    assert values["policy"] == 2 and values["service_backend_missing"] == 0
    assert "new_flows" not in values  # not a drop


def test_first_backends_inline_in_the_frontend_and_rewritten_with_them() -> None:
    maps = Maps()
    m = maps.manager()
    many = [(f"10.65.0.{i}", 8080) for i in range(1, fe_map.INLINE_BACKENDS + 3)]
    for msg in (frontend("10.96.0.10", 80, *many), proto.InSync()):
        m.on_update(msg)
    m.apply()
    (raw,) = maps.fe.data.values()
    value = fe_map.decode_value(raw)
    assert value["backends"] == len(many)
    assert value["inline_backends"] == many[:fe_map.INLINE_BACKENDS]
    assert len(maps.be.data) == len(many)  # nat_backend keeps every index
    # a change among the inline ones rewrites the frontend (view() checks the copy)
    fe_writes = maps.fe.writes
    m.on_update(frontend("10.96.0.10", 80, ("10.65.0.9", 8080), *many[1:]))
    m.apply()
    assert maps.fe.writes == fe_writes + 1
    assert maps.view()[("10.96.0.10", 80, "tcp")]["backends"][0] == ("10.65.0.9", 8080)
    # a change beyond them does not
    fe_writes = maps.fe.writes
    m.on_update(frontend("10.96.0.10", 80, ("10.65.0.9", 8080), *many[1:-1],
                         ("10.65.0.99", 8080)))
    m.apply()
    assert maps.fe.writes == fe_writes


def test_affinity_of_ids_without_a_pinned_frontend_is_dropped_at_sync() -> None:
    # nat_frontend replaced (a new layout version, another size): its ids are given out
    # afresh, so affinity entries left from the old ids must not steer the new owners
    maps = Maps()
    maps.aff.update(aff_map.encode_key(1, "10.65.0.7"), aff_map.encode_value("10.65.9.9", 80, 1))
    m = maps.manager()
    for msg in (frontend("10.96.0.10", 80, ("10.65.0.1", 8080)), proto.InSync()):
        m.on_update(msg)
    m.apply()
    assert set(m.service_ids().values()) == {1}
    assert maps.aff.data == {}
    # a restart with the frontend pinned keeps its entries
    maps.aff.update(aff_map.encode_key(1, "10.65.0.7"), aff_map.encode_value("10.65.0.1", 8080, 1))
    again = maps.manager()
    again.apply()
    assert len(maps.aff.data) == 1


def test_ipv6_manager_writes_only_ipv6_frontends_to_the_v6_maps() -> None:
    """family=6: the *6 maps, IPv6 VIPs only (the IPv4 manager fed the same stream keeps
    its own), make-before-break removal, affinity cleaned of removed backends."""
    from pyfelix.agent.bpf.maps import nat_affinity6, nat_backend6, nat_frontend6

    fe6 = FakeMap(nat_frontend6.PARAMS)
    be6 = FakeMap(nat_backend6.PARAMS)
    aff6 = FakeMap(nat_affinity6.PARAMS)
    m6 = BpfNatManager(fe6, be6, aff6, None, family=6)
    maps = Maps()
    m4 = maps.manager()
    stream = [proto.InSync(),
              frontend("fd00:96::10", 80, ("fd00:65::1", 8080), ("fd00:65::2", 8080),
                       affinity=30),
              frontend("10.96.0.10", 80, ("10.65.0.1", 8080))]
    for m in (m4, m6):
        for msg in stream:
            m.on_update(msg)
        m.apply()
    assert [nat_frontend6.decode_key(k)["vip"] for k in fe6.data] == ["fd00:96::10"]
    value = nat_frontend6.decode_value(next(iter(fe6.data.values())))
    assert (value["backends"], value["flags"]) == (2, ["affinity"])
    sid = value["service_id"]
    assert sorted(nat_backend6.decode_value(v) for v in be6.data.values()) == [
        ("fd00:65::1", 8080), ("fd00:65::2", 8080)]
    assert list(maps.view()) == [("10.96.0.10", 80, "tcp")]
    aff6.update(nat_affinity6.encode_key(sid, "fd00:65::9"),
                nat_affinity6.encode_value("fd00:65::2", 8080, 1))
    m6.on_update(frontend("fd00:96::10", 80, ("fd00:65::1", 8080), affinity=30))
    m6.apply()
    assert len(be6.data) == 1 and not aff6.data  # the affinity to the removed backend went
    m6.on_update(proto.ServiceFrontendRemove("fd00:96::10:80/6"))
    m6.apply()
    assert not fe6.data and not be6.data and list(maps.view()) == [("10.96.0.10", 80, "tcp")]
