"""One module per BPF map (see bpf/README.md for the layouts). `ALL_MAPS` lists the params of
every data map the programs pin under the pin directory, in a stable order; `dump_pinned()`
is what `pyfelix bpf <map> dump` needs: plain, JSON-ready rows, read without BCC."""

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
from agent.bpf.maps.base import BpfMap, MapParams

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
