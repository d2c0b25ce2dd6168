"""Lab names: run ids, namespace names the sweep recognises, Calico-style veth names."""

from __future__ import annotations

import pytest

from pyfelix.lab import naming


def test_run_ids_are_fresh_and_recognised_in_namespace_names() -> None:
    ids = {naming.new_run_id() for _ in range(50)}
    assert len(ids) == 50
    for run_id in ids:
        assert naming.RUN_ID_PATTERN.match(run_id)
        for name in (naming.underlay_netns(run_id), naming.node_netns(run_id, 0, "node1"),
                     naming.pod_netns(run_id, 3, "prod", "api")):
            assert naming.parse_run_id(name) == run_id


@pytest.mark.parametrize("foreign", ["pf12345-ul", "pf1234567-ul", "pfabcdeg-ul", "xpf123456-ul",
                                     "pf123456", "pf123456-", "pf123456-UL", "cni-1234",
                                     "pf123456-ul\n"])
def test_names_not_ours_are_not_recognised(foreign: str) -> None:
    assert naming.parse_run_id(foreign) is None


def test_long_names_fall_back_to_indexes_and_stay_bounded() -> None:
    long = "a" * 60
    assert naming.pod_netns("pf000000", 7, long, long) == "pf000000-p7"
    assert naming.node_netns("pf000000", 2, long) == "pf000000-n2"
    assert naming.pod_netns("pf000000", 7, "x", "a") == "pf000000-p-x.a"


def test_workload_interface_names_fit_ifnamsiz_and_differ_per_pod() -> None:
    names = {naming.workload_interface_name("ns", f"pod-{i}") for i in range(200)}
    assert len(names) == 200
    for name in names:
        assert name.startswith("cali") and len(name) == 15
        int(name[4:], 16)
    assert naming.workload_interface_name("a", "b") == naming.workload_interface_name("a", "b")
    # "<namespace>.<pod>" is hashed: the split point matters
    assert naming.workload_interface_name("a.b", "c") == naming.workload_interface_name("a", "b.c")
    assert naming.workload_interface_name("ns", "p", prefix="tap").startswith("tap")
    with pytest.raises(ValueError, match="too long"):
        naming.workload_interface_name("ns", "p", prefix="toolong")
