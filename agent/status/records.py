"""Status records: what an agent reports about itself and its endpoints to the datastore.

Role: the data half of Felix's status reporting (`/calico/felix/v2/<region>/host/<host>/status`
and per-endpoint status keys). Plain frozen dataclasses with JSON (de)serialisation; stores
(`agent.status.stores`) write them, readers (`pyfelix status`, `pyfelix get`) read them.

- `NodeStatus`: per node, rewritten every reporting interval: `timestamp` (wall clock of the
  write, unix seconds), `uptime` (seconds since the agent started), `first_update` (true in
  the first record an agent writes after it starts, as Felix's `first_update`), `in_sync`
  (the dataplane is programmed), `ttl` (seconds the record stays valid without a rewrite:
  ReportingTTLSecs).
- `EndpointStatus`: per endpoint when EndpointReportingEnabled: `status` "up" (its interface
  exists and is up), "down" (missing or down) or "error" (it cannot be programmed).
  Written when it changes, not every interval: it lives as long as its node's record.

Expiry: a node record older than its TTL is expired - the agent stopped without cleaning up
(a clean stop deletes its records; in etcd they also go with their lease). An endpoint
record is expired when its node's record is expired or missing.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

ENDPOINT_STATES = ("up", "down", "error")
WORKLOAD = "workload"
HOST = "host"


class StatusRecordError(ValueError):
    """A stored status record does not parse; the message names the record and field."""


def _json_object(text: str | bytes, where: str) -> dict[str, Any]:
    """`text` parsed, when it is a JSON object; else a StatusRecordError naming `where`."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StatusRecordError(f"{where}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise StatusRecordError(f"{where}: not a JSON object")
    return data


def _field(data: dict[str, Any], name: str, kind: type, where: str) -> Any:
    value = data.get(name)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        raise StatusRecordError(f"{where}: field {name!r} is missing or not {kind.__name__}")
    return value


@dataclass(frozen=True)
class NodeStatus:
    hostname: str
    timestamp: float
    uptime: float
    first_update: bool
    in_sync: bool
    ttl: float

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) - self.timestamp > self.ttl

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "node status") -> NodeStatus:
        data = _json_object(text, where)
        return cls(hostname=_field(data, "hostname", str, where),
                   timestamp=_field(data, "timestamp", float, where),
                   uptime=_field(data, "uptime", float, where),
                   first_update=_field(data, "first_update", bool, where),
                   in_sync=_field(data, "in_sync", bool, where),
                   ttl=_field(data, "ttl", float, where))


@dataclass(frozen=True)
class EndpointStatus:
    hostname: str
    kind: str  # "workload" | "host"
    endpoint: str  # workload: "<orchestrator>/<workload>/<endpoint>"; host: the HEP's name
    status: str  # "up" | "down" | "error"
    timestamp: float

    def __post_init__(self) -> None:
        if self.kind not in (WORKLOAD, HOST):
            raise StatusRecordError(f"endpoint status {self.endpoint}: kind {self.kind!r} is "
                                    "not workload or host")
        if self.status not in ENDPOINT_STATES:
            raise StatusRecordError(f"endpoint status {self.endpoint}: status {self.status!r} "
                                    f"is not one of {', '.join(ENDPOINT_STATES)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "endpoint status") -> EndpointStatus:
        data = _json_object(text, where)
        return cls(hostname=_field(data, "hostname", str, where),
                   kind=_field(data, "kind", str, where),
                   endpoint=_field(data, "endpoint", str, where),
                   status=_field(data, "status", str, where),
                   timestamp=_field(data, "timestamp", float, where))


@dataclass
class StatusSnapshot:
    """Everything a store holds, plus the records it could not read (named)."""

    nodes: list[NodeStatus]
    endpoints: list[EndpointStatus]
    problems: list[str]

    def node(self, hostname: str) -> NodeStatus | None:
        return next((n for n in self.nodes if n.hostname == hostname), None)

    def endpoint_expired(self, endpoint: EndpointStatus, now: float | None = None) -> bool:
        node = self.node(endpoint.hostname)
        return node is None or node.expired(now)

    def live(self, now: float | None = None) -> StatusSnapshot:
        """Only the records that have not expired."""
        return StatusSnapshot([n for n in self.nodes if not n.expired(now)],
                              [e for e in self.endpoints if not self.endpoint_expired(e, now)],
                              list(self.problems))

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {
            "nodes": [{**asdict(n), "age": round(now - n.timestamp, 3),
                       "expired": n.expired(now)} for n in self.nodes],
            "endpoints": [{**asdict(e), "expired": self.endpoint_expired(e, now)}
                          for e in self.endpoints],
            "problems": list(self.problems),
        }
