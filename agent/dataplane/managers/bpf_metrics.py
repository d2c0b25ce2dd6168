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
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
