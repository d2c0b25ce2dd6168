"""Flow logs: the dataplane's policy-decision events -> aggregated JSON lines.

Two sources, one aggregator and file:
- BPF mode (`FlowLogManager`): the tc programs' events from this build's ring buffer;
- iptables mode (`NflogFlowLogManager`): the NFLOG rules the renderer puts before each
  decision (agent/dataplane/iptables/nflog.py: group 1 denies, group 2 allows of new flows,
  the prefix naming the rule), read from nfnetlink_log (agent/shims/nflog.py). The reader
  takes at most `max_events_per_sec` messages a second; the rest overflow the socket's
  buffer in the kernel, which counts them, so a flood costs the agent a bounded share of
  one core.
Lost events, both modes: `pyfelix_flow_log_events_dropped_total`.

Flow ends (allowed flows; the record of the same key as the start's, `num_flows_completed`,
`flow_packets` and `flow_bytes` of both directions): BPF, the conntrack cleaner hands over
each expired entry it deletes (`on_ct_expired`: the entry's own counts at its interface;
an entry the LRU map evicts first ends unrecorded); iptables, conntrack's destroy events
(agent/shims/conntrack_events.py) joined with the allow events that started the flow (a
flow whose start was not seen, or forgotten past MAX_STARTED, ends unrecorded).

BPF mode: a thread reads this build's `flow_events` ring buffer (bpf/include/flow_events.h:
one event per policy decision, rate-limited in the kernel, the rest counted as
`flow_events_dropped`), aggregates the events per (source, destination, destination port,
protocol, action, deciding policy rule, reporter) over `FlowLogsFlushInterval` and appends
one JSON object per aggregate to `<FlowLogsFileDirectory>/flows.log`, rotated at
`FlowLogsFileMaxFileSizeMB` (`flows.log.1` ... `.FlowLogsFileMaxFiles`).

Inputs: the loop's `WorkloadEndpointUpdate/Remove` (local endpoints' addresses -> namespace
and pod name: the enrichment), the policy manager's counter metadata (counter id -> tier,
policy, rule index, action). Outputs: the file; `pyfelix_flow_log_events_total`,
`pyfelix_flow_log_records_total`. Field names are Calico's flow-log names where one exists
(start_time, end_time, source_ip, source_name, source_namespace, source_type, dest_ip,
dest_name, dest_namespace, dest_type, dest_port, proto, action, reporter, policies
{all_policies: ["<order>|<tier>|<policy>|<action>|<rule index>"]}, num_flows,
num_flows_started, num_flows_completed); pyfelix's own: `flow_packets`, `flow_bytes`,
`source_ports` (the first MAX_SOURCE_PORTS of the aggregated flows' source ports, sorted;
ICMP: echo ids), packets and bytes of the packets
policy decided (`policy_packets`, `policy_bytes`: a new flow's first packet, every packet
of a denied one), not the flow's whole traffic. Remote endpoints are not named (`-`, type
`net`): the dataplane knows only its own endpoints.

Invariants: the reader never blocks the dataplane loop (its own thread); a write error is
logged with the number of records lost (the next flush tries the file again).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from pyfelix.agent import proto
from pyfelix.agent.bpf.maps import conntrack as ct_map
from pyfelix.agent.bpf.maps import flow_events as events_map
from pyfelix.agent.dataplane.iptables import nflog as nflog_prefixes
from pyfelix.agent.dataplane.manager import ManagerBase

log = logging.getLogger(__name__)

FILE_NAME = "flows.log"
MAX_SOURCE_PORTS = 32  # listed per record (all when fewer): which flows a record holds
DEFAULT_EVENTS_PER_SEC = 5000  # iptables mode's reader budget (BPF: FLOW_EVENTS_PER_SEC)
PROTO_NAMES = {1: "icmp", 6: "tcp", 17: "udp", 58: "icmp6", 132: "sctp"}
ICMP_PROTOCOLS = (1, 58)  # no destination port

EVENTS = Counter("pyfelix_flow_log_events", "Policy-decision events read from the kernel's "
                 "flow_events ring buffer (the dropped ones: pyfelix_bpf global counter "
                 "flow_events_dropped).")
RECORDS = Counter("pyfelix_flow_log_records", "Aggregated flow-log records written.")
EVENTS_DROPPED = Counter("pyfelix_flow_log_events_dropped", "Policy-decision events the "
                         "flow logs lost to overload. BPF: over the in-kernel budget or with "
                         "the ring buffer full (the global counter flow_events_dropped). "
                         "iptables: NFLOG messages the kernel dropped with the reader's "
                         "socket buffer full (the reader takes at most its per-second "
                         "budget).")
FLOW_ENDS = Counter("pyfelix_flow_log_flow_ends", "iptables mode: conntrack destroy events "
                    "read (a flow-end record for those an allow event of ours started).")
NFLOG_MALFORMED = Counter("pyfelix_flow_log_events_malformed", "iptables mode: NFLOG messages "
                          "that did not parse, or whose prefix names no known rule.")


def policy_label(meta: Any) -> str:
    """Calico's flow-log policy string `<order>|<tier>|<policy>|<action>|<rule index>`."""
    if meta is None:
        return "0|__NO_MATCH__|__NO_MATCH__|deny|-1"
    if meta.kind == "profile":
        return f"0|__PROFILE__|{meta.owner}|{meta.action}|{meta.index}"
    if meta.kind == "tier-end":
        return f"0|{meta.tier}|{meta.tier}.__TIER_END__|deny|-1"
    if meta.kind == "default-deny":
        return "0|__DEFAULT__|__DEFAULT__.__DENY__|deny|-1"
    return f"0|{meta.tier}|{meta.owner}|{meta.action}|{meta.index}"


class FlowAggregator:
    """Pure: events in, Calico-named records out at `flush()`."""

    def __init__(self, name_of: Callable[[str], tuple[str, str] | None],
                 meta_of: Callable[[int], Any]) -> None:
        self._name_of = name_of
        self._meta_of = meta_of
        self._lock = threading.Lock()
        self._flows: dict[tuple[Any, ...], dict[str, Any]] = {}

    def add(self, ev: dict[str, Any]) -> None:
        """`ev`: a decoded BPF event (`counter_id` -> meta_of) or the same keys with the
        deciding rule itself as `meta` (iptables mode)."""
        if "meta" in ev:
            meta = ev["meta"]
        else:
            meta = self._meta_of(ev["counter_id"]) if ev["counter_id"] else None
        action = "allow" if ev["allowed"] else "deny"
        reporter = "src" if ev["hook"] == events_map.HOOK_FROM_WEP else "dst"
        key = (ev["src"], ev["dst"], ev["dport"], ev["proto"], action, policy_label(meta),
               reporter)
        with self._lock:
            rec = self._record(key)
            rec["ports"].add(ev["sport"])
            rec["packets"] += 1
            rec["bytes"] += ev["len"]

    def end(self, flow: dict[str, Any]) -> None:
        """An allowed flow ended (BPF: its conntrack entry expired; iptables: conntrack's
        destroy event): `flow` = src, dst, sport, dport, proto, hook, meta (the rule that
        allowed it, None if unknown), packets, bytes (both directions)."""
        reporter = "src" if flow["hook"] == events_map.HOOK_FROM_WEP else "dst"
        policy = policy_label(flow["meta"]) if flow["meta"] is not None else "-"
        key = (flow["src"], flow["dst"], flow["dport"], flow["proto"], "allow", policy,
               reporter)
        with self._lock:
            rec = self._record(key)
            rec["ended"].add(flow["sport"])
            rec["flow_packets"] += flow["packets"]
            rec["flow_bytes"] += flow["bytes"]

    def _record(self, key: tuple[Any, ...]) -> dict[str, Any]:
        """The aggregate of `key` in this interval (the lock held)."""
        now = time.time()
        rec = self._flows.get(key)
        if rec is None:  # named now: the endpoint may be gone by the flush
            rec = self._flows[key] = {"start": now, "end": now, "ports": set(),
                                      "ended": set(), "packets": 0, "bytes": 0,
                                      "flow_packets": 0, "flow_bytes": 0,
                                      "source": self._name_of(key[0]),
                                      "dest": self._name_of(key[1])}
        rec["end"] = now
        return rec

    def flush(self) -> list[dict[str, Any]]:
        with self._lock:
            flows, self._flows = self._flows, {}
        out = []
        for (src, dst, dport, proto_num, action, policy, reporter), rec in sorted(
                flows.items(), key=lambda kv: kv[1]["start"]):
            source, dest = rec["source"], rec["dest"]
            out.append({
                "start_time": int(rec["start"]), "end_time": int(rec["end"]) + 1,
                "source_ip": src, "source_namespace": source[0] if source else "-",
                "source_name": source[1] if source else "-",
                "source_type": "wep" if source else "net",
                "dest_ip": dst, "dest_namespace": dest[0] if dest else "-",
                "dest_name": dest[1] if dest else "-", "dest_type": "wep" if dest else "net",
                "dest_port": dport if proto_num not in ICMP_PROTOCOLS else None,
                "proto": PROTO_NAMES.get(proto_num, str(proto_num)),
                "action": action, "reporter": reporter,
                "policies": {"all_policies": [policy]},
                "num_flows": len(rec["ports"] | rec["ended"]),
                "num_flows_started": len(rec["ports"]),
                "num_flows_completed": len(rec["ended"]),
                "flow_packets": rec["flow_packets"], "flow_bytes": rec["flow_bytes"],
                "source_ports": sorted(rec["ports"] | rec["ended"])[:MAX_SOURCE_PORTS],
                "policy_packets": rec["packets"], "policy_bytes": rec["bytes"],
            })
        return out


class FlowLogFile:
    """Appends JSON lines to `<directory>/flows.log`, rotating at `max_bytes`."""

    def __init__(self, directory: str, *, max_bytes: int, max_files: int) -> None:
        self.path = Path(directory) / FILE_NAME
        self.max_bytes = max_bytes
        self.max_files = max_files

    def write(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size >= self.max_bytes:
            self._rotate()
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))

    def _rotate(self) -> None:
        for i in range(self.max_files - 1, 0, -1):
            older = Path(f"{self.path}.{i}")
            if older.exists():
                os.replace(older, f"{self.path}.{i + 1}")
        os.replace(self.path, f"{self.path}.1")


class FlowLogManager(ManagerBase):
    name = "flow-logs"
    policy_critical = False

    def __init__(self, bpf: Any, meta_of: Callable[[int], Any], *, directory: str,
                 flush_interval: float, max_bytes: int, max_files: int,
                 dropped_events: Callable[[], int] | None = None) -> None:
        super().__init__()
        self._dropped_events = dropped_events  # the kernel's running total (BPF mode)
        self.dropped = 0  # the total seen so far
        self._bpf = bpf
        self._meta_of = meta_of
        self._names: dict[str, tuple[str, str]] = {}
        self._by_endpoint: dict[proto.WorkloadEndpointID, tuple[str, ...]] = {}
        self.aggregator = FlowAggregator(self._names.get, meta_of)
        self.file = FlowLogFile(directory, max_bytes=max_bytes, max_files=max_files)
        self._interval = flush_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_close: Callable[[], None] | None = None

    def on_update(self, msg: object) -> None:
        if isinstance(msg, proto.WorkloadEndpointUpdate):
            self._forget(msg.id)
            namespace, _, pod = msg.id.workload.partition("/")
            addrs = tuple(n.split("/")[0]
                          for n in (*msg.endpoint.ipv4_nets, *msg.endpoint.ipv6_nets))
            self._by_endpoint[msg.id] = addrs
            for a in addrs:
                self._names[a] = (namespace, pod or namespace)
        elif isinstance(msg, proto.WorkloadEndpointRemove):
            self._forget(msg.id)

    def on_ct_expired(self, raw_key: bytes, raw_value: bytes) -> None:
        """BPF: the conntrack cleaner deleted an expired entry -> a flow-end record (the
        entry's interface saw the flow's packets and bytes, both directions)."""
        try:
            key, value = ct_map.decode_key(raw_key), ct_map.decode_value(raw_value)
            a_to_b = bool(value.flags & ct_map.CtFlags.ORIG_A_TO_B)
            src, sport, dst, dport = ((key.addr_a, key.port_a, key.addr_b, key.port_b) if a_to_b
                                      else (key.addr_b, key.port_b, key.addr_a, key.port_a))
            self.aggregator.end({
                "src": src, "dst": dst, "sport": sport, "dport": dport, "proto": key.proto,
                "hook": (events_map.HOOK_TO_WEP if value.flags & ct_map.CtFlags.ORIG_TO_WEP
                         else events_map.HOOK_FROM_WEP),
                "meta": self._meta_of(value.counter_id) if value.counter_id else None,
                "packets": value.packets, "bytes": value.bytes})
        except Exception:  # a bad entry must not stop the cleaner
            log.exception("flow logs: cannot decode an expired conntrack entry")

    def _forget(self, endpoint_id: proto.WorkloadEndpointID) -> None:
        for a in self._by_endpoint.pop(endpoint_id, ()):
            self._names.pop(a, None)

    def apply(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="flow-logs", daemon=True)
            self._thread.start()

    def _on_event(self, _ctx: Any, data: Any, size: int) -> int:
        import ctypes

        try:
            raw = ctypes.string_at(data, min(size, events_map.SIZE))
            EVENTS.inc()
            self.aggregator.add(events_map.decode(raw))
        except Exception:  # a bad record must not stop the reader
            log.exception("flow logs: cannot decode an event of %d bytes", size)
        return 0

    def _run(self) -> None:
        self._bpf["flow_events"].open_ring_buffer(self._on_event)
        next_flush = time.monotonic() + self._interval
        while not self._stop.is_set():
            self._bpf.ring_buffer_poll(100)
            if time.monotonic() >= next_flush:
                if self._dropped_events is not None:
                    try:
                        self.count_dropped(self._dropped_events())
                    except Exception as exc:  # a map read must not stop the reader
                        log.warning("flow logs: cannot read the dropped events: %s", exc)
                self.flush()
                next_flush = time.monotonic() + self._interval
        self._bpf.ring_buffer_consume()
        self.flush()

    def count_dropped(self, total: int) -> None:
        """The kernel's running total of lost events -> the metric's increase."""
        if total > self.dropped:
            EVENTS_DROPPED.inc(total - self.dropped)
            self.dropped = total

    def flush(self) -> None:
        records = self.aggregator.flush()
        try:
            self.file.write(records)
            RECORDS.inc(len(records))
        except OSError as exc:
            log.warning("flow logs: cannot write %s: %s (%d records dropped)", self.file.path,
                        exc, len(records))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.on_close is not None:
            self.on_close()
            self.on_close = None


class NflogFlowLogManager(FlowLogManager):
    """iptables mode: NFLOG groups 1 and 2 of this namespace -> the same records; and
    conntrack's destroy events -> flow-end records of the flows an allow event started
    (the rule that allowed each remembered per 5-tuple, at most MAX_STARTED flows)."""

    MAX_STARTED = 65536

    def __init__(self, *, directory: str, flush_interval: float, max_bytes: int,
                 max_files: int, netns: str | None = None,
                 max_events_per_sec: int = DEFAULT_EVENTS_PER_SEC,
                 open_socket: Callable[[], Any] | None = None,
                 open_ct_socket: Callable[[], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(None, lambda _n: None, directory=directory,
                         flush_interval=flush_interval, max_bytes=max_bytes,
                         max_files=max_files)
        self.decoder = nflog_prefixes.PrefixDecoder()
        self._netns = netns
        self._open_socket = open_socket
        self._open_ct_socket = open_ct_socket
        self._ns: Any = None  # NetnsThread in the dataplane's namespace, once opened
        self._socks: list[Any] = []  # the NFLOG socket, then conntrack's if it opened
        # (src, dst, sport, dport, proto) -> [(rule, hook)] of the allows that started it
        self._started: OrderedDict[tuple[Any, ...], list[tuple[Any, int]]] = OrderedDict()
        self._budget = max_events_per_sec
        self._clock = clock

    def on_update(self, msg: object) -> None:
        super().on_update(msg)
        if isinstance(msg, proto.ActivePolicyUpdate):
            self.decoder.learn(msg.id.tier, msg.id.name)
        elif isinstance(msg, proto.ActivePolicyRemove):
            self.decoder.forget(msg.id.tier, msg.id.name)
        elif isinstance(msg, proto.ActiveProfileUpdate):
            self.decoder.learn("", msg.id)
        elif isinstance(msg, proto.ActiveProfileRemove):
            self.decoder.forget("", msg.id)

    def add_packet(self, pkt: Any) -> bool:
        """One NflogPacket -> the aggregator; False if its prefix names no rule of ours."""
        rule = self.decoder.decode(pkt.prefix)
        if rule is None:
            return False
        hook = (events_map.HOOK_TO_WEP if rule.direction == "ingress"
                else events_map.HOOK_FROM_WEP)
        self.aggregator.add({
            "src": pkt.src, "dst": pkt.dst, "sport": pkt.sport, "dport": pkt.dport,
            "proto": pkt.proto, "len": pkt.length, "allowed": rule.action == "allow",
            "hook": hook, "meta": rule})
        if rule.action == "allow":
            flow = (pkt.src, pkt.dst, pkt.sport, pkt.dport, pkt.proto)
            deciders = self._started.setdefault(flow, [])
            if (rule, hook) not in deciders:
                deciders.append((rule, hook))
            self._started.move_to_end(flow)
            while len(self._started) > self.MAX_STARTED:
                self._started.popitem(last=False)
        return True

    def end_flow(self, end: Any) -> bool:
        """One conntrack FlowEnd -> flow-end records of each allow that started it; False
        when no allow of ours is remembered for it (started before us, or forgotten)."""
        deciders = self._started.pop((end.src, end.dst, end.sport, end.dport, end.proto), None)
        for rule, hook in deciders or ():
            self.aggregator.end({"src": end.src, "dst": end.dst, "sport": end.sport,
                                 "dport": end.dport, "proto": end.proto, "hook": hook,
                                 "meta": rule, "packets": end.packets, "bytes": end.bytes})
        return bool(deciders)

    def apply(self) -> None:
        """First apply: bind the sockets now, in the loop's round, before the iptables
        manager (after this one) writes the NFLOG rules, so no first flow goes unheard;
        then the reader thread."""
        if self._thread is None:
            self._open()
            if self._socks:
                super().apply()

    def _open(self) -> None:
        from pyfelix.agent.shims import conntrack_events
        from pyfelix.agent.shims.netns import NetnsThread
        from pyfelix.agent.shims.nflog import NflogSocket

        def open_ct() -> Any:
            sock = conntrack_events.ConntrackEndSocket()
            try:
                conntrack_events.enable_accounting()
            except OSError as exc:
                log.warning("flow logs: cannot enable conntrack accounting (%s): flow-end "
                            "records will count 0 packets", exc)
            return sock

        if self._ns is not None:
            return  # opened once (a failure is not retried: logged, no flow logs)
        self._ns = NetnsThread(self._netns)
        opener = self._open_socket or (lambda: NflogSocket(
            (nflog_prefixes.GROUP_DENY, nflog_prefixes.GROUP_ALLOW)))
        try:
            self._socks = [self._ns.call(opener)]
        except OSError as exc:
            log.error("flow logs: cannot read NFLOG: %s; no flow logs", exc)
            return
        try:
            self._socks.append(self._ns.call(self._open_ct_socket or open_ct))
        except OSError as exc:
            log.warning("flow logs: no conntrack destroy events (%s): no flow-end records",
                        exc)

    def _run(self) -> None:
        ns, socks = self._ns, self._socks
        assert ns is not None
        try:
            self._read_loop(socks[0], lambda: sum(ns.call(s.kernel_drops) for s in socks),
                            socks[1] if len(socks) > 1 else None)
        finally:
            for s in socks:
                s.close()

    def close(self) -> None:
        super().close()  # the reader thread closes the sockets as it ends
        if self._ns is not None:
            self._ns.close()
            self._ns = None

    def _read_loop(self, sock: Any, kernel_drops: Callable[[], int],
                   ct_sock: Any = None) -> None:
        """Both sockets under one per-second budget of messages."""
        import select

        readers = [sock] if ct_sock is None else [sock, ct_sock]
        next_flush = self._clock() + self._interval
        window, taken = self._clock(), 0
        while not self._stop.is_set():
            now = self._clock()
            if now - window >= 1.0:
                window, taken = now, 0
            if taken >= self._budget:  # over budget: let the kernel queue/drop the rest
                self._stop.wait(max(0.0, window + 1.0 - now))
            elif ready := select.select(readers, [], [], 0.1)[0]:
                for _ in range(min(256, self._budget - taken)):
                    for reader in ready:
                        taken += 1
                        if reader is sock:
                            packets, malformed = sock.read()
                            for pkt in packets:
                                EVENTS.inc()
                                if not self.add_packet(pkt):
                                    malformed += 1
                        else:
                            ends, malformed = reader.read()
                            for end in ends:
                                FLOW_ENDS.inc()
                                self.end_flow(end)
                        if malformed:
                            NFLOG_MALFORMED.inc(malformed)
                    if not (ready := select.select(readers, [], [], 0)[0]):
                        break
            if self._clock() >= next_flush:
                self.count_dropped(kernel_drops())
                self.flush()
                next_flush = self._clock() + self._interval
        self.flush()
