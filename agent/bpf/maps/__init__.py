"""One module per BPF map (see bpf/README.md for the layouts). `ALL_MAPS` lists the params of
every data map the programs pin under the pin directory, in a stable order; `dump_pinned()`
is what `pyfelix bpf <map> dump` needs: plain, JSON-ready rows, read without BCC;
`summary_pinned()` is `pyfelix bpf summary`: how full each pinned map is."""

from __future__ import annotations

from agent.bpf.maps import (
    config,
    conntrack,
    counters,
    endpoints,
    ids,
    ipsets,
    routes,
    rules,
    untracked,
)
from agent.bpf.maps.base import ARRAY_TYPES, BpfMap, MapParams

ALL_MAPS: tuple[MapParams, ...] = (
    ipsets.PARAMS,
    ids.PARAMS,
    rules.PARAMS,
    endpoints.PARAMS,
    conntrack.PARAMS,
    counters.RULE_COUNTERS,
    counters.EP_COUNTERS,
    counters.GLOBAL_COUNTERS,
    routes.PARAMS,
    config.PARAMS,
    untracked.PARAMS,
)

BY_NAME: dict[str, MapParams] = {p.name: p for p in ALL_MAPS}


_DUMPERS = {
    "ipsets": ipsets.dump, "ids": ids.dump, "rules": rules.dump, "endpoints": endpoints.dump,
    "conntrack": conntrack.dump, "rule_counters": counters.dump_rules,
    "ep_counters": counters.dump_endpoints, "global_counters": counters.dump_globals,
    "routes": routes.dump, "config": config.dump, "untracked": untracked.dump,
}


def dump_pinned(name: str, pin_dir: str) -> list[dict]:
    """Rows of the pinned map `name` (one of BY_NAME). Raises KeyError for an unknown name,
    OSError if the map is not pinned there."""
    if name not in BY_NAME:
        raise KeyError(f"unknown BPF map {name!r}; known: {', '.join(sorted(BY_NAME))}")
    with BpfMap.open_pinned(BY_NAME[name], pin_dir) as m:
        return _DUMPERS[name](m)


# Arrays always hold max_entries slots; for these the slots in use are the non-zero ones
# (an unused rule record or config slot is all zeros). Counter arrays have no "in use".
_SLOTS_IN_USE_ARRAYS = frozenset({"rules", "config"})


def summary_pinned(pin_dir: str) -> list[dict]:
    """One row per data map: {"map", "type", "entries", "max_entries", "fill_pct"}, or
    {"map", "error"} for a map that is not pinned (or not readable) under pin_dir. `entries`
    counts keys (hash, LRU, LPM trie) or, for the rules and config arrays, the non-zero
    slots; it is None for the per-CPU counter arrays (every slot always exists)."""
    rows: list[dict] = []
    for params in ALL_MAPS:
        row: dict = {"map": params.name, "type": params.map_type.name.lower()}
        try:
            with BpfMap.open_pinned(params, pin_dir) as m:
                row["max_entries"] = m.max_entries
                if params.map_type not in ARRAY_TYPES:
                    entries: int | None = sum(1 for _ in m.iter_keys())
                elif params.name in _SLOTS_IN_USE_ARRAYS:
                    entries = sum(1 for _, value in m.items() if any(value))
                else:
                    entries = None
        except OSError as exc:
            rows.append({"map": params.name, "error": f"not readable: {exc}"})
            continue
        row["entries"] = entries
        row["fill_pct"] = (None if entries is None
                           else round(100.0 * entries / max(1, m.max_entries), 1))
        rows.append(row)
    return rows
