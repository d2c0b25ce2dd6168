"""What the nodes' flow logs said about each lab probe.

Role: joins the probes of a run with the flow-log records the lab agents wrote (each agent
writes `<run>/agents/flows/<node>/flows.log` when `AgentProcesses(flow_logs=True)`), so a
probe's report carries `"flow": {"action", "policy", "reporter"}`: the verdict the
dataplane recorded and the policy rule that decided it, in Calico's flow-log policy string
(`<order>|<tier>|<policy>|<action>|<rule index>`).

Inputs: the probe results with the wall-clock window each batch ran in, the pods' IPs, the
records. Outputs: one `flow` dict (or None: nothing recorded) per probe.

Matching: same source IP, destination IP, destination port (None for ICMP) and protocol;
the probe's own source port among the record's `source_ports` (every probe binds a fresh
one; a record listing fewer ports than its flows may hold it unlisted); a record whose
[start_time - 1, end_time + 1] overlaps the probe batch's window (records are aggregated
per flush interval, times in whole seconds). Of those, the records that started nearest
the window's start; among them a deny when there is one (the policy that dropped the
connection), else the destination's ingress allow (reporter `dst`), else the source's
egress allow.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyfelix.lab.scenario import ProbeSpec

FLOW_LOG_FILE = "flows.log"


@dataclass(frozen=True)
class ProbeWindow:
    """Wall-clock seconds during which a batch of probes ran."""

    started: float
    ended: float


def read_records(directories: Iterable[Path]) -> list[dict[str, Any]]:
    """Every JSON line of `flows.log` and its rotations in each directory (unparsable
    lines, e.g. one being written, are skipped)."""
    records: list[dict[str, Any]] = []
    for directory in directories:
        for path in sorted(Path(directory).glob(FLOW_LOG_FILE + "*")):
            try:
                lines = path.read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
    return records


PREFERENCE = (("deny", "src"), ("deny", "dst"), ("allow", "dst"), ("allow", "src"))


def _decisive(candidates: list[dict[str, Any]], window: ProbeWindow) -> dict[str, Any] | None:
    """The record that started nearest the window's start (an earlier probe of the same
    5-tuple, under other policy, may still be within the slack), then by PREFERENCE."""
    ranked = [(abs(rec.get("start_time", 0) - int(window.started)),
               PREFERENCE.index((rec.get("action"), rec.get("reporter"))), i)
              for i, rec in enumerate(candidates)
              if (rec.get("action"), rec.get("reporter")) in PREFERENCE]
    return candidates[min(ranked)[2]] if ranked else None


def _may_hold(rec: dict[str, Any], sport: int) -> bool:
    """False when the record lists all its flows' source ports and `sport` is not one."""
    ports = rec.get("source_ports")
    if not sport or ports is None or sport in ports:
        return True
    return len(ports) < rec.get("num_flows", 0)  # the list was cut: it may be unlisted


def flow_for(probe: ProbeSpec, source_ip: str, window: ProbeWindow,
             records: list[dict[str, Any]], sport: int = 0) -> dict[str, Any] | None:
    """The deciding record of one probe as {"action", "policy", "reporter"}, or None.
    `sport`: the probe's source port, when known (records listing theirs must hold it)."""
    protocol = probe.protocol.lower()
    port = None if protocol == "icmp" else probe.port
    candidates = [
        rec for rec in records
        if rec.get("source_ip") == source_ip and rec.get("dest_ip") == str(probe.target_ip)
        and rec.get("dest_port") == port and rec.get("proto") == protocol
        and rec.get("start_time", 0) - 1 <= window.ended
        and rec.get("end_time", 0) + 1 >= window.started and _may_hold(rec, sport)
    ]
    rec = _decisive(candidates, window)
    if rec is None:
        return None
    policies = rec.get("policies", {}).get("all_policies") or [None]
    return {"action": rec["action"], "policy": policies[0], "reporter": rec["reporter"]}


def decided(probe: ProbeSpec, flow: dict[str, Any] | None) -> bool:
    """Whether `flow` can be the probe's final answer: a deny, or the destination pod's own
    record (its node's flush may come later than the source's: an allow the source's
    egress recorded is not yet the answer while the destination may still deny). Probes to
    an address that is no pod's have no destination record to wait for."""
    if flow is None:
        return False
    return flow["action"] == "deny" or flow["reporter"] == "dst" or "/" not in probe.target


def flows_for(probes: Iterable[tuple[ProbeSpec, ProbeWindow, int]],
              pod_ips: Mapping[str, str],
              records: list[dict[str, Any]],
              pod_ips6: Mapping[str, str] | None = None) -> list[dict[str, Any] | None]:
    """`flow_for` of each (probe, window, source port or 0); the source pod's address is
    looked up in `pod_ips` (IPv4) or `pod_ips6` (IPv6 probes). A probe from an unknown pod
    gets None."""
    out: list[dict[str, Any] | None] = []
    for probe, window, sport in probes:
        source_ip = (pod_ips6 or {}).get(probe.source) if probe.family == 6 \
            else pod_ips.get(probe.source)
        out.append(None if source_ip is None
                   else flow_for(probe, source_ip, window, records, sport))
    return out
