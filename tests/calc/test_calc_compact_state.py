"""The calc side's compact per-endpoint state (issue 22, memory per remote endpoint) keeps
the behaviour of the plain dicts, sets and lists it replaced: label pairs shared between
endpoints, one-source destinations in the route resolver, one-output/one-owner entries in
the validator, own labels derived from the effective labels less the (shared) inherited keys."""

from __future__ import annotations

from calc_testlib import namespace, node, pod

from pyfelix.agent.calc import CalcPipeline, ExpectedDataplane
from pyfelix.agent.calc.labels import LabelInheritIndex
from pyfelix.agent.conversion import k8s
from pyfelix.agent.syncer.api import RawUpdate, SyncStatus, key_of


def ups(*docs: dict) -> list[RawUpdate]:
    return [RawUpdate(key_of(d), d, "test") for d in docs]


def dels(*docs: dict) -> list[RawUpdate]:
    return [RawUpdate(key_of(d), None, "test") for d in docs]


def test_label_pairs_are_sorted_shared_and_bounded(monkeypatch) -> None:
    first = k8s.shared_label_pairs({"tier": "web", "app": "a"})
    second = k8s.shared_label_pairs({"app": "a", "tier": "web", "hash": "x1"})
    assert first == (("app", "a"), ("tier", "web"))
    assert second == (("app", "a"), ("hash", "x1"), ("tier", "web"))
    assert first[0] is second[0] and first[1] is second[2]
    monkeypatch.setattr(k8s, "MAX_SHARED_LABEL_PAIRS", 4)
    monkeypatch.setattr(k8s, "_label_pairs", {})
    for index in range(20):
        assert k8s.shared_label_pairs({"n": str(index)}) == (("n", str(index)),)
        assert len(k8s._label_pairs) <= 4


def test_a_destination_with_two_sources_keeps_a_route_until_both_go() -> None:
    state = ExpectedDataplane(strict=False)
    pipeline = CalcPipeline("node-a", state)
    first = pod("ns", "first", "node-b", "10.70.0.9")
    second = pod("ns", "second", "node-c", "10.70.0.9")  # the same address, another node
    pipeline.feed(ups(namespace("ns"), node("node-b", "198.18.0.2"),
                      node("node-c", "198.18.0.3"), first, second), SyncStatus.IN_SYNC)
    assert state.routes["10.70.0.9/32"].dst_node in ("node-b", "node-c")
    pipeline.feed(dels(first))
    assert state.routes["10.70.0.9/32"].dst_node == "node-c"
    pipeline.feed(ups(first))
    pipeline.feed(dels(second))
    assert state.routes["10.70.0.9/32"].dst_node == "node-b"
    pipeline.feed(dels(first))
    assert "10.70.0.9/32" not in state.routes


def test_validator_outputs_and_owners_round_trip() -> None:
    from pyfelix.agent.validator import Validator

    validator = Validator()
    doc = pod("ns", "web", "node-b", "10.70.0.5")
    (update,) = validator.on_updates(ups(doc))
    assert update.value is not None
    assert validator.outputs_of(key_of(doc)) == {update.key: update.value}
    (gone,) = validator.on_updates(dels(doc))
    assert gone.key == update.key and gone.value is None
    assert validator.outputs_of(key_of(doc)) == {}


def test_label_index_rebuilds_effective_labels_from_shared_keys() -> None:
    seen: dict = {}
    index = LabelInheritIndex(lambda item, labels: seen.__setitem__(item, labels))
    index.update_parent("kns.ns", {"ns-label": "1", "app": "parent"})
    index.update_item("a", {"app": "x", "tier": "web"}, ("kns.ns",))
    index.update_item("b", {"app": "y", "tier": "web"}, ("kns.ns",))
    assert seen["a"] == {"app": "x", "tier": "web", "ns-label": "1"}  # own wins
    assert index._inherited["a"] is index._inherited["b"]  # one keys tuple for both
    index.update_parent("kns.ns", {"ns-label": "2"})
    assert seen["b"] == {"app": "y", "tier": "web", "ns-label": "2"}
    # an own label equal to the parent's stays when the parent's goes
    index.update_item("c", {"ns-label": "2"}, ("kns.ns",))
    index.update_parent("kns.ns", None)
    assert seen["c"] == {"ns-label": "2"}
    assert seen["b"] == {"app": "y", "tier": "web"}
    index.update_parent("kns.ns", {"ns-label": "3", "extra": "e"})
    assert seen["c"] == {"ns-label": "2", "extra": "e"}
    index.update_item("c", {}, ("kns.ns",))  # its own label removed: the parent's shows
    assert seen["c"] == {"ns-label": "3", "extra": "e"}
    index.delete_item("a")
    assert seen["a"] is None and len(index) == 2
