"""lab.flows: joining probes with the nodes' flow-log records (no kernel)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

from pyfelix.lab.flows import ProbeWindow, flow_for, flows_for, read_records
from pyfelix.lab.probe import ProbeResult
from pyfelix.lab.scenario import ProbeSpec

PROBE = ProbeSpec("prod/client", "prod/api", ipaddress.IPv4Address("10.65.0.1"), 443, "TCP")


def _rec(action: str, reporter: str, policy: str, *, start: int = 100, end: int = 101,
         port: int | None = 443, src: str = "10.65.0.2") -> dict[str, Any]:
    return {"source_ip": src, "dest_ip": "10.65.0.1", "dest_port": port, "proto": "tcp",
            "action": action, "reporter": reporter, "start_time": start, "end_time": end,
            "policies": {"all_policies": [policy]}}


def test_the_deny_decides_else_the_destination_allow() -> None:
    window = ProbeWindow(100.2, 100.9)
    egress = _rec("allow", "src", "0|__PROFILE__|kns.prod|allow|0")
    ingress = _rec("allow", "dst", "0|default|allow-https|allow|0")
    assert flow_for(PROBE, "10.65.0.2", window, [egress, ingress]) == {
        "action": "allow", "policy": "0|default|allow-https|allow|0", "reporter": "dst"}
    assert flow_for(PROBE, "10.65.0.2", window, [egress])["reporter"] == "src"  # type: ignore[index]
    deny = _rec("deny", "dst", "0|default|deny-scanner|deny|0")
    assert flow_for(PROBE, "10.65.0.2", window, [egress, deny])["action"] == "deny"  # type: ignore[index]


def test_other_tuples_and_other_times_do_not_match() -> None:
    window = ProbeWindow(100.2, 100.9)
    others = [_rec("deny", "dst", "x", port=80), _rec("deny", "dst", "x", src="10.65.0.9"),
              _rec("deny", "dst", "x", start=200, end=201), _rec("deny", "dst", "x", start=90,
                                                                 end=98)]
    assert flow_for(PROBE, "10.65.0.2", window, others) is None
    # a record whose whole-second times end just before the window still counts (slack 1 s)
    assert flow_for(PROBE, "10.65.0.2", window, [_rec("deny", "dst", "x", start=99, end=100)])


def test_records_are_read_from_every_node_and_rotation(tmp_path: Path) -> None:
    for node, name, rec in (("n1", "flows.log", _rec("allow", "src", "a")),
                            ("n2", "flows.log.1", _rec("deny", "dst", "b"))):
        (tmp_path / node).mkdir()
        (tmp_path / node / name).write_text(json.dumps(rec) + "\n{half a line")
    records = read_records([tmp_path / "n1", tmp_path / "n2", tmp_path / "absent"])
    assert sorted(r["policies"]["all_policies"][0] for r in records) == ["a", "b"]
    [flow] = flows_for([(PROBE, ProbeWindow(100.0, 101.0), 0)], {"prod/client": "10.65.0.2"},
                       records)
    assert flow == {"action": "deny", "policy": "b", "reporter": "dst"}
    assert flows_for([(PROBE, ProbeWindow(100.0, 101.0), 0)], {}, records) == [None]


def test_probe_json_has_flow_only_once_collected() -> None:
    r = ProbeResult(PROBE, 0, "allow", "echoed", 0.01)
    assert "flow" not in r.to_json()
    collected = ProbeResult(PROBE, 0, "allow", "echoed", 0.01, flow=None, flows_collected=True)
    assert collected.to_json()["flow"] is None


def test_an_earlier_probe_of_the_same_tuple_within_the_slack_does_not_decide() -> None:
    before = _rec("allow", "dst", "0|__PROFILE__|kns.db|allow|0", start=100, end=101)
    after = _rec("allow", "dst", "0|default|db-from-web|allow|0", start=101, end=102)
    [flow] = flows_for([(PROBE, ProbeWindow(101.1, 101.5), 0)], {"prod/client": "10.65.0.2"},
                       [before, after])
    assert flow is not None and flow["policy"] == "0|default|db-from-web|allow|0"


def test_the_probes_source_port_picks_its_record() -> None:
    before = {**_rec("allow", "dst", "profile", start=100, end=102), "num_flows": 2,
              "source_ports": [10001, 10002]}
    after = {**_rec("allow", "dst", "policy", start=101, end=102), "num_flows": 1,
             "source_ports": [10007]}
    window = ProbeWindow(100.5, 101.5)
    assert flow_for(PROBE, "10.65.0.2", window, [before, after], 10007)["policy"] == "policy"  # type: ignore[index]
    assert flow_for(PROBE, "10.65.0.2", window, [before, after], 10002)["policy"] == "profile"  # type: ignore[index]
    assert flow_for(PROBE, "10.65.0.2", window, [before, after], 10009) is None
    cut = {**before, "num_flows": 40}  # more flows than listed: may hold any port
    assert flow_for(PROBE, "10.65.0.2", window, [cut], 10009) is not None


def test_a_source_side_allow_is_not_yet_the_answer_for_a_pod() -> None:
    from pyfelix.lab.flows import decided

    egress = {"action": "allow", "policy": "p", "reporter": "src"}
    assert not decided(PROBE, egress) and not decided(PROBE, None)
    assert decided(PROBE, {**egress, "reporter": "dst"})
    assert decided(PROBE, {**egress, "action": "deny"})
    to_address = ProbeSpec("prod/client", "192.0.2.1", ipaddress.IPv4Address("192.0.2.1"), 80,
                           "TCP")
    assert decided(to_address, egress)
