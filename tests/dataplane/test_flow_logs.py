"""Flow-log aggregation, file rotation and `pyfelix flows` (no kernel: events as the ring
buffer's decoded records)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from pyfelix.agent import proto
from pyfelix.agent.bpf.maps import flow_events as events_map
from pyfelix.agent.dataplane.managers.flow_logs import FlowAggregator, FlowLogFile, FlowLogManager
from pyfelix.agent.proto import RuleMeta
from pyfelix.cli.main import cli

DENY = RuleMeta("policy", "default", "deny-scanner", "ingress", 0, "deny")


def _event(src: str, sport: int, *, allowed: bool = False, counter: int = 7,
           hook: int = events_map.HOOK_TO_WEP) -> dict:
    return {"ts_ns": 1, "src": src, "dst": "10.65.0.1", "sport": sport, "dport": 443,
            "proto": 6, "hook": hook, "allowed": allowed, "counter_id": counter,
            "endpoint_id": 1, "len": 60}


def test_events_aggregate_per_flow_key_with_calico_field_names() -> None:
    names = {"10.65.0.1": ("prod", "api"), "10.65.0.3": ("prod", "scanner")}
    agg = FlowAggregator(names.get, {7: DENY}.get)
    for sport in (1000, 1000, 1001):
        agg.add(_event("10.65.0.3", sport))
    agg.add(_event("192.0.2.9", 2000))
    records = agg.flush()
    assert agg.flush() == []  # flushed once
    [named, outside] = sorted(records, key=lambda r: r["source_ip"])
    assert {k: named[k] for k in ("source_namespace", "source_name", "source_type", "dest_name",
                                  "dest_port", "proto", "action", "reporter")} == {
        "source_namespace": "prod", "source_name": "scanner", "source_type": "wep",
        "dest_name": "api", "dest_port": 443, "proto": "tcp", "action": "deny",
        "reporter": "dst"}
    assert named["policies"] == {"all_policies": ["0|default|deny-scanner|deny|0"]}
    assert (named["num_flows"], named["policy_packets"], named["policy_bytes"]) == (2, 3, 180)
    assert (outside["source_type"], outside["source_name"]) == ("net", "-")


def test_rotation_keeps_max_files(tmp_path: Path) -> None:
    f = FlowLogFile(str(tmp_path), max_bytes=50, max_files=2)
    for i in range(5):
        f.write([{"n": i, "pad": "x" * 40}])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["flows.log", "flows.log.1", "flows.log.2"]
    assert json.loads((tmp_path / "flows.log").read_text())["n"] == 4
    assert json.loads((tmp_path / "flows.log.2").read_text())["n"] == 2


def test_manager_names_local_endpoints_from_its_messages(tmp_path: Path) -> None:
    m = FlowLogManager(None, lambda n: None, directory=str(tmp_path), flush_interval=1,
                       max_bytes=1 << 20, max_files=1)
    wid = proto.WorkloadEndpointID("k8s", "prod/api", "eth0")
    m.on_update(proto.WorkloadEndpointUpdate(wid, proto.WorkloadEndpoint(
        state="active", name="cali1", ipv4_nets=("10.65.0.1/32",))))
    m.aggregator.add(_event("10.65.0.3", 1, allowed=True, counter=0,
                            hook=events_map.HOOK_FROM_WEP))
    m.on_update(proto.WorkloadEndpointRemove(wid))
    m.aggregator.add(_event("10.65.0.3", 2, allowed=True, counter=0))
    m.flush()
    lines = [json.loads(x) for x in (tmp_path / "flows.log").read_text().splitlines()]
    assert [(r["dest_name"], r["reporter"]) for r in lines] == [("api", "src"), ("-", "dst")]


def test_flows_cli_filters_and_prints(tmp_path: Path) -> None:
    agg = FlowAggregator({"10.65.0.1": ("prod", "api")}.get, {7: DENY}.get)
    agg.add(_event("10.65.0.3", 1))
    agg.add(_event("10.65.0.4", 1, allowed=True, counter=0))
    FlowLogFile(str(tmp_path), max_bytes=1 << 20, max_files=1).write(agg.flush())
    out = CliRunner().invoke(cli, ["flows", "--dir", str(tmp_path), "--denied", "-o", "json"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    assert [r["source_ip"] for r in rows] == ["10.65.0.3"]
    table = CliRunner().invoke(cli, ["flows", "--dir", str(tmp_path), "--namespace", "prod"])
    assert "DENY" in table.stdout and "ALLOW" in table.stdout and "prod/api:443" in table.stdout


def test_expired_conntrack_entries_become_flow_end_records(tmp_path: Path) -> None:
    from pyfelix.agent.bpf.conntrack import ConntrackCleaner
    from pyfelix.agent.bpf.maps import conntrack as ct_map
    from pyfelix.agent.bpf.maps.base import FakeMap

    allow = RuleMeta("policy", "default", "allow-https", "ingress", 0, "allow")
    m = FlowLogManager(None, {9: allow}.get, directory=str(tmp_path), flush_interval=1,
                       max_bytes=1 << 20, max_files=1)
    ct = FakeMap(ct_map.PARAMS)
    now = 10_000 * ct_map.NS_PER_S
    flags = ct_map.CtFlags
    # client 10.65.0.3:40001 -> api 10.65.0.1:443 at api's interface: normalised, the api
    # is side A (smaller address), so the original direction is B -> A
    key, src_is_a = ct_map.normalise(7, "10.65.0.3", "10.65.0.1", 40001, 443, 6)
    assert not src_is_a
    closed = int(flags.ORIG_TO_WEP | flags.SEEN_REPLY | flags.FIN_ORIG | flags.FIN_REPLY)
    ct.update(ct_map.encode_key(key), ct_map.encode_value(ct_map.FlowValue(
        0, now - 3600 * ct_map.NS_PER_S, 12, 3400, closed, 9)))
    # a live flow is not ended
    live, _ = ct_map.normalise(7, "10.65.0.3", "10.65.0.1", 40002, 443, 6)
    ct.update(ct_map.encode_key(live), ct_map.encode_value(ct_map.FlowValue(
        0, now, 3, 180, int(flags.ORIG_TO_WEP | flags.SEEN_REPLY), 9)))
    stats = ConntrackCleaner(ct, clock_ns=lambda: now, on_expired=m.on_ct_expired).run_once()
    assert stats.deleted == 1
    m.flush()
    [rec] = [json.loads(x) for x in (tmp_path / "flows.log").read_text().splitlines()]
    assert {k: rec[k] for k in ("source_ip", "dest_ip", "dest_port", "proto", "action",
                                "reporter", "num_flows", "num_flows_started",
                                "num_flows_completed", "flow_packets", "flow_bytes",
                                "source_ports")} == {
        "source_ip": "10.65.0.3", "dest_ip": "10.65.0.1", "dest_port": 443, "proto": "tcp",
        "action": "allow", "reporter": "dst", "num_flows": 1, "num_flows_started": 0,
        "num_flows_completed": 1, "flow_packets": 12, "flow_bytes": 3400,
        "source_ports": [40001]}
    assert rec["policies"] == {"all_policies": ["0|default|allow-https|allow|0"]}
