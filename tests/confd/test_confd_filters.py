"""BGPFilter through the reconciler: a peer's filters reach its session, a changed filter
reloads BIRD, an invalid filter is named, counted, and its peer left out (fail closed)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confd_fakes import FakeBird, doc_node, doc_peer, doc_pool, upd
from prometheus_client import REGISTRY

from pyfelix.agent.syncer.api import SyncStatus
from pyfelix.confd.watcher import ConfdReconciler, Outcome

API = "projectcalico.org/v3"


def bgp_filter(name: str, spec: dict) -> dict:
    return {"apiVersion": API, "kind": "BGPFilter", "metadata": {"name": name}, "spec": spec}


def invalid_count() -> float:
    return REGISTRY.get_sample_value("pyfelix_confd_invalid_resources_total",
                                     {"kind": "BGPFilter"}) or 0.0


def test_filter_rendered_changed_and_invalid(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    config_path = tmp_path / "bird.conf"
    bird = FakeBird(config_path)
    reconciler = ConfdReconciler("node1", config_path, tmp_path / "bird.ctl",
                                 tools=bird)  # type: ignore[arg-type]
    reject7 = {"exportV4": [{"action": "Reject", "matchOperator": "In",
                             "cidr": "10.65.7.0/24"}]}
    reconciler.on_updates([upd(d) for d in (
        doc_node("node1", "198.18.0.1/15"), doc_pool("pool", "10.65.0.0/16"),
        doc_peer("tor", peerIP="198.19.0.1", asNumber=65001, filters=["f"]),
        bgp_filter("f", reject7))])
    reconciler.on_status(SyncStatus.IN_SYNC)
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "if ( (net ~ 10.65.7.0/24) ) then reject;" in bird.running_config
    assert "'pyfelix_bgpfilter_f_export4'();" in bird.running_config

    reject8 = {"exportV4": [{"action": "Reject", "matchOperator": "In",
                             "cidr": "10.65.8.0/24"}]}
    reconciler.on_updates([upd(bgp_filter("f", reject8))])
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "10.65.8.0/24" in bird.running_config and "10.65.7.0/24" not in bird.running_config

    before = invalid_count()
    broken = {"exportV4": [{"action": "Reject", "matchOperator": "Around",
                            "cidr": "10.65.8.0/24"}]}
    reconciler.on_updates([upd(bgp_filter("f", broken))])
    assert reconciler.reconcile() is Outcome.RELOADED
    assert invalid_count() == before + 1
    assert "neighbor 198.19.0.1" not in bird.running_config
    assert "BGPFilter(f): spec.exportV4[0].matchOperator: 'Around' is not one of" in caplog.text
    assert ("BGPPeer(tor): spec.filters[0]: BGPFilter 'f' not found (or invalid); peer not "
            "rendered (its routes would pass unfiltered)") in caplog.text
