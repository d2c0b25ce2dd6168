"""Prometheus metrics of the BPF dataplane managers (one place, so every manager and the
tests use the same objects).

- `pyfelix_bpf_map_full_errors_total{map}`: writes that did not fit in a map (one per map
  per apply round that hit the limit). Never a silent drop: each also logs an error naming
  the map and what was left out, and the affected endpoints fail closed.
- `pyfelix_bpf_map_entries{map}` / `pyfelix_bpf_map_max_entries{map}`: fill of each map
  the managers own, as of their last apply (conntrack: as of the cleaner's last scan).
- `pyfelix_bpf_compile_problems`: problems the policy compiler reported in its last
  compile (unknown policy, invalid rule field, map full...); each is logged once.
- `pyfelix_bpf_attach_*`: program attachment on interfaces.
- `pyfelix_bpf_conntrack_*`: the conntrack cleaner.
- `pyfelix_bpf_dropped_packets_total{reason}`: every packet the programs or the guard
  dropped, by reason (read from the `global_counters` and `nat_counters` maps and the nft
  guard's rule counters at scrape time; `DROPS`);
  `pyfelix_bpf_endpoint_spoofed_packets_total{endpoint}`: packets each local endpoint sent
  from a source it may not use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

# global_counters name -> drop reason label (agent.bpf.maps.counters.GlobalCounter)
DROP_REASONS = {
    "spoofed_dropped": "spoofed_source",
    "ipv6_dropped": "ipv6_disabled",  # Ipv6Support false
    "ipv6_ext_dropped": "ipv6_extension_headers",  # a chain the parser does not walk
    "unknown_proto_dropped": "unknown_protocol",
    "no_endpoint_dropped": "no_endpoint",
    "policy_denied": "policy",
    "admin_down_dropped": "admin_down",
    "malformed_dropped": "malformed",
    "tail_call_failed": "tail_call_failed",
    "bad_rule_index": "bad_rule_index",
    "ep_to_host_dropped": "endpoint_to_host",
    "xdp_dropped": "xdp_untracked_deny",
    "hep_rpf_dropped": "host_endpoint_rpf",
    "classifier_error": "classifier_error",
    "tunnel_from_wep_dropped": "tunnel_from_workload",  # Allow*PacketsFromWorkloads false
}
GUARD_REASONS = {"from_unprogrammed": "guard_from_unprogrammed",
                 "to_unprogrammed": "guard_to_unprogrammed"}
# nat_counters name -> drop reason label (agent.bpf.maps.nat_counters.NatCounter): packets
# of service flows that did not go through (a reject's packet became its ICMP error)
NAT_REASONS = {"rejected": "service_without_endpoints",
               "reject_failed": "service_reject_failed",
               "xlate_failed": "service_nat_failed",
               "no_backend": "service_backend_missing"}


class DropCollector:
    """Reads the drop counters when Prometheus scrapes: the sources are set by the BPF
    dataplane once built (`set_sources`); a failing source is logged and skipped."""

    def __init__(self) -> None:
        self._globals: Callable[[], Mapping[str, int]] | None = None
        self._guard: Callable[[], Mapping[str, int]] | None = None
        self._spoofed: Callable[[], Mapping[str, int]] | None = None
        self._nat: Callable[[], Mapping[str, int]] | None = None
        self._owner: object = None

    def set_sources(self, *, global_counters: Callable[[], Mapping[str, int]] | None,
                    guard: Callable[[], Mapping[str, int]] | None,
                    spoofed_by_endpoint: Callable[[], Mapping[str, int]] | None,
                    nat: Callable[[], Mapping[str, int]] | None = None,
                    owner: object = None) -> None:
        self._globals, self._guard, self._spoofed = global_counters, guard, spoofed_by_endpoint
        self._nat = nat
        self._owner = owner

    def forget(self, owner: object) -> None:
        """The sources of `owner` are gone (its maps closed): stop reading them, unless a
        newer owner has set its own meanwhile."""
        if owner is self._owner:
            self.set_sources(global_counters=None, guard=None, spoofed_by_endpoint=None)

    def describe(self) -> list[Metric]:
        return []  # values are read at collect time only

    def collect(self) -> Iterator[Metric]:
        if self._globals is None and self._guard is None:
            return
        drops = CounterMetricFamily(
            "pyfelix_bpf_dropped_packets",
            "Packets dropped by the BPF dataplane, by reason: spoofed_source (a workload "
            "sent from an address it may not use), ipv6_disabled (Ipv6Support false), "
            "ipv6_extension_headers (an IPv6 extension header chain not walked), "
            "unknown_protocol, "
            "no_endpoint, policy, admin_down, malformed, ..., and guard_from_unprogrammed / "
            "guard_to_unprogrammed (the nft guard: a workload interface our programs are "
            "not attached to yet), service_without_endpoints (rejected: ICMP port "
            "unreachable sent instead) and the service NAT's failures.",
            labels=["reason"])
        for source, names in ((self._globals, DROP_REASONS), (self._guard, GUARD_REASONS),
                              (self._nat, NAT_REASONS)):
            if source is None:
                continue
            try:
                values = source()
            except Exception as exc:  # a scrape must not fail for one source
                log.warning("drop counters: %s", exc)
                continue
            for name, reason in names.items():
                drops.add_metric([reason], float(values.get(name, 0)))
        yield drops
        if self._spoofed is not None:
            spoofed = CounterMetricFamily(
                "pyfelix_bpf_endpoint_spoofed_packets",
                "Packets a local workload endpoint sent from a source address it may not "
                "use (neither its own nor in allowSpoofedSourcePrefixes); all dropped.",
                labels=["endpoint"])
            try:
                for endpoint, packets in sorted(self._spoofed().items()):
                    spoofed.add_metric([endpoint], float(packets))
            except Exception as exc:
                log.warning("spoofed counters: %s", exc)
            yield spoofed


DROPS = DropCollector()
REGISTRY.register(DROPS)  # type: ignore[arg-type]

# At most this many policies get series of their own in the per-policy metrics; the rest
# are summed under policy="__other__" (bounded label cardinality whatever the cluster).
MAX_POLICY_SERIES = 500


def felix_policy_label(meta: Any) -> str:
    """Felix's `policy` label of calico_denied_packets: `<tier>|<policy>|<rule index>|<action>`;
    profiles as tier `__PROFILE__`, the end-of-tier deny as policy `__TIER_END__` and the
    final deny as `__DEFAULT__|__DENY__`, both with rule index -1."""
    if meta.kind == "profile":
        return f"__PROFILE__|{meta.owner}|{meta.index}|{meta.action}"
    if meta.kind == "tier-end":
        return f"{meta.tier}|__TIER_END__|-1|deny"
    if meta.kind == "default-deny":
        return "__DEFAULT__|__DENY__|-1|deny"
    return f"{meta.tier}|{meta.owner}|{meta.index}|{meta.action}"


class PolicyCounterCollector:
    """Per-policy and per-denying-rule metrics, read from the BPF counters at scrape time:

    - `calico_denied_packets` / `calico_denied_bytes` {policy, srcIP} (Felix's names and
      labels; gauges of the totals): what policy denied, per deciding rule and source, from
      the `denied_sources` LRU map, whose size bounds the series;
    - `pyfelix_policy_packets_total` / `pyfelix_policy_bytes_total` {tier, policy, action}:
      what each policy's rules decided (allow, deny, pass, log; the end-of-tier and final
      denies as policy `__TIER_END__` / `__DEFAULT__`), at most MAX_POLICY_SERIES policies.
    Sources are set by the BPF dataplane (`set_sources`); a failing one is logged, skipped."""

    def __init__(self) -> None:
        self._rules: Callable[[], list[tuple[Any, int, int]]] | None = None
        self._denied: Callable[[], list[tuple[Any, str, int, int]]] | None = None
        self._owner: object = None

    def set_sources(self, *, rules: Callable[[], list[tuple[Any, int, int]]] | None,
                    denied: Callable[[], list[tuple[Any, str, int, int]]] | None,
                    owner: object = None) -> None:
        self._rules, self._denied, self._owner = rules, denied, owner

    def forget(self, owner: object) -> None:
        if owner is self._owner:
            self.set_sources(rules=None, denied=None)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        if self._denied is not None:
            packets = GaugeMetricFamily(
                "calico_denied_packets", "Total number of packets denied by calico policies "
                "(per deciding rule and source; the BPF map bounds the series).",
                labels=["policy", "srcIP"])
            nbytes = GaugeMetricFamily(
                "calico_denied_bytes", "Total number of bytes denied by calico policies.",
                labels=["policy", "srcIP"])
            try:
                totals: dict[tuple[str, str], list[int]] = {}
                for meta, source, p, b in self._denied():
                    t = totals.setdefault((felix_policy_label(meta), source), [0, 0])
                    t[0] += p
                    t[1] += b
                for labels, (p, b) in sorted(totals.items()):
                    packets.add_metric(list(labels), float(p))
                    nbytes.add_metric(list(labels), float(b))
            except Exception as exc:
                log.warning("denied counters: %s", exc)
            yield packets
            yield nbytes
        if self._rules is not None:
            packets = CounterMetricFamily(
                "pyfelix_policy_packets", "Packets whose verdict a policy's rule decided "
                "(new flows: the first packet; denied flows: every packet), by action.",
                labels=["tier", "policy", "action"])
            nbytes = CounterMetricFamily(
                "pyfelix_policy_bytes", "Bytes of the packets counted by "
                "pyfelix_policy_packets.", labels=["tier", "policy", "action"])
            try:
                per: dict[tuple[str, str, str], list[int]] = {}
                for meta, p, b in self._rules():
                    policy = {"tier-end": "__TIER_END__", "default-deny": "__DEFAULT__"}.get(
                        meta.kind, meta.owner if meta.kind == "policy"
                        else f"__PROFILE__.{meta.owner}")
                    t = per.setdefault((meta.tier, policy, meta.action), [0, 0])
                    t[0] += p
                    t[1] += b
                kept = sorted({k[:2] for k in per})[:MAX_POLICY_SERIES]
                keep = set(kept)
                folded: dict[tuple[str, str, str], list[int]] = {}
                for (tier, policy, action), (p, b) in per.items():
                    key = ((tier, policy, action) if (tier, policy) in keep
                           else ("", "__other__", action))
                    t = folded.setdefault(key, [0, 0])
                    t[0] += p
                    t[1] += b
                for labels, (p, b) in sorted(folded.items()):
                    packets.add_metric(list(labels), float(p))
                    nbytes.add_metric(list(labels), float(b))
            except Exception as exc:
                log.warning("rule counters: %s", exc)
            yield packets
            yield nbytes


POLICY_COUNTERS = PolicyCounterCollector()
REGISTRY.register(POLICY_COUNTERS)  # type: ignore[arg-type]

MAP_FULL_ERRORS = Counter(
    "pyfelix_bpf_map_full_errors",
    "Number of BPF map writes that failed because the map was full, by map.",
    ["map"],
)
MAP_ENTRIES = Gauge(
    "pyfelix_bpf_map_entries",
    "Number of entries in a BPF map as of the last apply, by map.",
    ["map"],
)
MAP_MAX_ENTRIES = Gauge(
    "pyfelix_bpf_map_max_entries",
    "Capacity (max_entries) of a BPF map, by map.",
    ["map"],
)
COMPILE_PROBLEMS = Gauge(
    "pyfelix_bpf_compile_problems",
    "Number of problems the BPF policy compiler reported in its last compile.",
)
MAP_WRITES = Counter(
    "pyfelix_bpf_map_writes",
    "Number of BPF map entries written or deleted by the policy manager, by map and op.",
    ["map", "op"],
)
ATTACHED_INTERFACES = Gauge(
    "pyfelix_bpf_attached_interfaces",
    "Number of interfaces with the BPF programs attached, by hook.",
    ["hook"],
)
ATTACH_ERRORS = Counter(
    "pyfelix_bpf_attach_errors",
    "Number of failed attempts to attach a BPF program to an interface.",
)
ATTACH_LATENCY = Histogram(
    "pyfelix_bpf_attach_latency_seconds",
    "Seconds from the dataplane learning of a new workload interface to both tc programs "
    "being attached to it.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
CONNTRACK_CLEANED = Counter(
    "pyfelix_bpf_conntrack_cleaned",
    "Number of expired conntrack entries the cleaner deleted.",
)
CONNTRACK_CLEANER_ERRORS = Counter(
    "pyfelix_bpf_conntrack_cleaner_errors",
    "Number of conntrack cleaner runs that failed.",
)
