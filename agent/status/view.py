"""What `pyfelix status` shows, gathered and rendered (the CLI only calls this).

Inputs (each optional): the agent's status file (`StatusFile`: sync/apply state, dataplane
mode, counts), the datastore's status records (`agent.status.stores`), and BGP protocol
states (`birdc show protocols`, parsed by the caller). Output: one JSON-friendly dict
(`collect()`), and tables (`render()`), sorted. A source that cannot be read becomes a
`problems` entry, never an exception: status is what you run when something is wrong.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyfelix.agent.status.stores import StatusStoreError, open_status_store

if TYPE_CHECKING:
    from pyfelix.agent.datastore import DatastoreLocation

AGENT_FIELDS = ("hostname", "dataplane", "calc_in_sync", "dataplane_in_sync", "idle",
                "rounds_applied", "failures", "endpoints", "policies", "profiles", "ipsets",
                "not_implemented")  # Felix parameters set but not implemented (comma list)


def _agent(status_file: str, now: float, problems: list[str]) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(status_file).read_text())
    except (OSError, ValueError) as exc:
        problems.append(f"status file {status_file}: {exc}")
        return None
    if not isinstance(data, dict):
        problems.append(f"status file {status_file}: not a JSON object")
        return None
    out = {k: data[k] for k in AGENT_FIELDS if k in data}
    if "written_wall" in data:
        out["written_age_s"] = round(now - float(data["written_wall"]), 3)
    if data.get("last_update_wall"):
        out["last_update_age_s"] = round(now - float(data["last_update_wall"]), 3)
    return out


def collect(*, datastore: DatastoreLocation | None = None, status_file: str | None = None,
            hostname: str | None = None, bgp: Iterable[Any] | None = None,
            now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    problems: list[str] = []
    out: dict[str, Any] = {}
    if status_file:
        out["agent"] = _agent(status_file, now, problems)
    if datastore:
        try:
            store = open_status_store(datastore)
        except Exception as exc:  # a bad URL or unreachable store is reported, not raised
            problems.append(f"datastore {datastore}: {exc}")
            store = None
        if store is not None:
            try:
                snapshot = store.read()
            except StatusStoreError as exc:
                problems.append(f"datastore {datastore}: {exc}")
            else:
                data = snapshot.to_json(now)
                problems += data["problems"]
                out["nodes"] = sorted((n for n in data["nodes"]
                                       if hostname in (None, n["hostname"])),
                                      key=lambda n: n["hostname"])
                out["endpoints"] = sorted((e for e in data["endpoints"]
                                           if hostname in (None, e["hostname"])),
                                          key=lambda e: (e["hostname"], e["kind"],
                                                         e["endpoint"]))
            finally:
                store.close()
    if bgp is not None:
        out["bgp"] = sorted(({"name": p.name, "proto": p.proto, "state": p.state,
                              "info": p.info} for p in bgp), key=lambda p: p["name"])
    out["problems"] = problems
    return out


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def _yes(value: Any) -> str:
    return "yes" if value is True else "no" if value is False else str(value)


def render(status: dict[str, Any]) -> str:
    parts: list[str] = []
    agent = status.get("agent")
    if agent:
        parts.append(_table([["AGENT", "VALUE"]] + [[k, _yes(v)] for k, v in agent.items()]))
    if "nodes" in status:
        rows = [["NODE", "IN-SYNC", "UPTIME(s)", "AGE(s)", "FIRST-UPDATE", "EXPIRED"]]
        rows += [[n["hostname"], _yes(n["in_sync"]), f"{n['uptime']:.0f}", f"{n['age']:.0f}",
                  _yes(n["first_update"]), _yes(n["expired"])] for n in status["nodes"]]
        parts.append(_table(rows))
    if status.get("endpoints"):
        rows = [["NODE", "KIND", "ENDPOINT", "STATUS", "EXPIRED"]]
        rows += [[e["hostname"], e["kind"], e["endpoint"], e["status"], _yes(e["expired"])]
                 for e in status["endpoints"]]
        parts.append(_table(rows))
    if "bgp" in status:
        rows = [["BGP PROTOCOL", "PROTO", "STATE", "INFO"]]
        rows += [[p["name"], p["proto"], p["state"], p["info"] or "-"] for p in status["bgp"]]
        parts.append(_table(rows))
    if status.get("problems"):
        parts.append("\n".join(f"problem: {p}" for p in status["problems"]))
    return "\n\n".join(parts) if parts else "nothing to show (give --datastore, " \
                                            "--status-file or --bird-socket)"
