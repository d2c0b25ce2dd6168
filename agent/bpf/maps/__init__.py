"""One module per BPF map (see bpf/README.md for the layouts). `ALL_MAPS` lists the params of
every data map the programs pin under the pin directory, in a stable order."""

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
from agent.bpf.maps.base import MapParams

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
