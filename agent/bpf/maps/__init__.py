"""One module per BPF map (see bpf/README.md for the layouts). `ALL_MAPS` lists the params of
every data map the programs pin under the pin directory, in a stable order; `dump_pinned()`
is what `pyfelix bpf <map> dump` needs: plain, JSON-ready rows, read without BCC;
`summary_pinned()` is `pyfelix bpf summary`: how full each pinned map is."""

from __future__ import annotations

from types import ModuleType

from pyfelix.agent.bpf.maps import (
    cls_chains,
    cls_l4,
    cls_tries,
    cls_words,
    config,
    conntrack,
    counters,
    ctlb_rev,
    denied_sources,
    endpoints,
    ep_by_ifindex,
    ids,
    ipsets,
    nat_affinity,
    nat_affinity6,
    nat_backend,
    nat_backend6,
    nat_counters,
    nat_ct,
    nat_ct6,
    nat_frontend,
    nat_frontend6,
    nat_vip_filter,
    routes,
    rules,
    untracked,
    verdict_trace,
    wep_sources,
)
from pyfelix.agent.bpf.maps.base import ARRAY_TYPES, BATCH_TYPES, BpfMap, MapLayoutError, MapParams

ALL_MAPS: tuple[MapParams, ...] = (
    ipsets.PARAMS,
    ids.PARAMS,
    rules.PARAMS,
    endpoints.PARAMS,
    ep_by_ifindex.PARAMS,
    conntrack.PARAMS,
    counters.RULE_COUNTERS,
    counters.EP_COUNTERS,
    counters.EP_SPOOFED,
    counters.GLOBAL_COUNTERS,
    routes.PARAMS,
    config.PARAMS,
    untracked.PARAMS,
    wep_sources.PARAMS,
    nat_frontend.PARAMS,
    nat_backend.PARAMS,
    nat_affinity.PARAMS,
    nat_ct.PARAMS,
    nat_counters.PARAMS,
    nat_vip_filter.PARAMS,
    nat_frontend6.PARAMS,
    nat_backend6.PARAMS,
    nat_affinity6.PARAMS,
    nat_ct6.PARAMS,
    cls_chains.PARAMS,
    cls_l4.PARAMS,
    cls_tries.PARAMS,
    cls_words.PARAMS,
    ctlb_rev.PARAMS,
    verdict_trace.PARAMS,
    denied_sources.PARAMS,
)

BY_NAME: dict[str, MapParams] = {p.name: p for p in ALL_MAPS}


_DUMPERS = {
    "ipsets": ipsets.dump, "ids": ids.dump, "rules": rules.dump, "endpoints": endpoints.dump,
    "ep_by_ifindex": ep_by_ifindex.dump,
    "conntrack": conntrack.dump, "rule_counters": counters.dump_rules,
    "ep_counters": counters.dump_endpoints,
    "ep_spoofed": counters.dump_spoofed, "global_counters": counters.dump_globals,
    "routes": routes.dump, "config": config.dump, "untracked": untracked.dump,
    "wep_sources": wep_sources.dump,
    "nat_frontend": nat_frontend.dump, "nat_backend": nat_backend.dump,
    "ctlb_rev": ctlb_rev.dump,
    "nat_affinity": nat_affinity.dump, "nat_ct": nat_ct.dump, "nat_counters": nat_counters.dump,
    "nat_vip_filter": nat_vip_filter.dump,
    "nat_frontend6": nat_frontend6.dump, "nat_backend6": nat_backend6.dump,
    "nat_affinity6": nat_affinity6.dump, "nat_ct6": nat_ct6.dump,
    "cls_chains": cls_chains.dump, "cls_l4": cls_l4.dump, "cls_tries": cls_tries.dump,
    "verdict_trace": verdict_trace.dump,
    "denied_sources": denied_sources.dump,
}


def dump_pinned(name: str, pin_dir: str) -> list[dict]:
    """Rows of the pinned map `name` (one of BY_NAME). Raises KeyError for an unknown name,
    OSError if the map is not pinned there."""
    if name not in BY_NAME:
        raise KeyError(f"unknown BPF map {name!r}; known: {', '.join(sorted(BY_NAME))}")
    if name == "cls_words":  # the headers of the instances cls_chains points at
        with BpfMap.open_pinned(cls_chains.PARAMS, pin_dir) as chains:
            instances = [row["instance"] for row in cls_chains.dump(chains)]
        with BpfMap.open_pinned(cls_words.PARAMS, pin_dir) as m:
            return cls_words.dump(m, instances)
    with BpfMap.open_pinned(BY_NAME[name], pin_dir) as m:
        return _DUMPERS[name](m)


def _rules_in_use(pin_dir: str) -> int:
    """Rule records inside the chains the pinned endpoints reference (shared chains counted
    once). Records of freed chains stay in the array until reused, so counting non-zero
    records would overstate the fill after policy churn."""
    in_use: set[int] = set()
    with BpfMap.open_pinned(endpoints.PARAMS, pin_dir) as m:
        for _, raw in m.items():
            value = endpoints.decode_value(raw)
            for chain in (value["ingress"], value["egress"]):
                in_use.update(range(chain["start"], chain["start"] + chain["len"]))
    return len(in_use)


def _entries(params: MapParams, m: BpfMap, pin_dir: str) -> int | None:
    if params.name == "rules":
        return _rules_in_use(pin_dir)
    if params.name == "cls_words":
        with BpfMap.open_pinned(cls_chains.PARAMS, pin_dir) as chains:
            instances = {row["instance"] for row in cls_chains.dump(chains)}
        return sum(cls_words.read_header(m, i)["block_words"] for i in instances)
    if params.map_type in ARRAY_TYPES:
        return None  # counters and config: every slot always exists
    if params.map_type in BATCH_TYPES:
        return len(m.items())
    return sum(1 for _ in m.iter_keys())


def summary_pinned(pin_dir: str) -> list[dict]:
    """One row per data map: {"map", "type", "entries", "max_entries", "fill_pct"}, or
    {"map", "error"} for a map that is not pinned, not readable, or of another layout
    under pin_dir. `entries` counts keys (hash, LRU, LPM trie: a snapshot of a live map,
    so approximate while packets create flows) or, for the rules array, the records inside
    chains the endpoints reference; None for the other arrays (every slot always exists)."""
    rows: list[dict] = []
    for params in ALL_MAPS:
        row: dict = {"map": params.name, "type": params.map_type.name.lower()}
        try:
            with BpfMap.open_pinned(params, pin_dir) as m:
                row["max_entries"] = m.max_entries
                entries = _entries(params, m, pin_dir)
        except MapLayoutError as exc:
            rows.append({"map": params.name, "error": f"layout differs: {exc}"})
            continue
        except OSError as exc:
            rows.append({"map": params.name, "error": f"not readable: {exc}"})
            continue
        row["entries"] = entries
        row["fill_pct"] = (None if entries is None
                           else round(100.0 * entries / max(1, row["max_entries"]), 1))
        rows.append(row)
    return rows


def rules_by_counter_pinned(pin_dir: str) -> list[dict]:
    """Every rule counter (ids kind RULE) with its packets/bytes (summed over CPUs) and the
    records of the chains in use that count into it, their IP sets named (the `ids` names:
    calc-graph IP-set ids, compiler net sets by content) instead of numbered:
    [{"counter_id", "name", "packets", "bytes", "records": [{"index", "action", ...}]}]."""
    with BpfMap.open_pinned(ids.PARAMS, pin_dir) as m:
        names = ids.read_all(m)
    set_names = {**names[ids.IdKind.NETSET], **names[ids.IdKind.IPSET]}
    with BpfMap.open_pinned(counters.RULE_COUNTERS, pin_dir) as m:
        counts = {row["counter_id"]: row for row in counters.dump_rules(m)}
    chains: set[tuple[int, int]] = set()
    with BpfMap.open_pinned(endpoints.PARAMS, pin_dir) as m:
        for _, raw in m.items():
            value = endpoints.decode_value(raw)
            chains |= {(value[d]["start"], value[d]["len"]) for d in ("ingress", "egress")
                       if value[d]["len"]}
    records: dict[int, list[dict]] = {}
    with BpfMap.open_pinned(rules.PARAMS, pin_dir) as m:
        for row in rules.dump(m, sorted(chains)):
            number = row.pop("counter_id", 0)
            if not number:
                continue
            if "set_checks" in row:
                row["set_checks"] = [_name_set_check(c, set_names) for c in row["set_checks"]]
            for group in ("src_ports", "not_src_ports", "dst_ports", "not_dst_ports"):
                if group in row:
                    row[group]["named_sets"] = [set_names.get(n, str(n))
                                                for n in row[group]["named_sets"] if n]
            records.setdefault(number, []).append(row)
    out = []
    for number, name in sorted(names[ids.IdKind.RULE].items()):
        count = counts.get(number, {})
        out.append({"counter_id": number, "name": name, "packets": count.get("packets", 0),
                    "bytes": count.get("bytes", 0), "records": records.get(number, [])})
    return out


def _name_set_check(text: str, set_names: dict[int, str]) -> str:
    """"src in 12" -> "src in s:abc..." (the check as rules.describe() words it)."""
    words = text.rsplit(" ", 1)
    if len(words) == 2 and words[1].isdigit():
        return f"{words[0]} {set_names.get(int(words[1]), words[1])}"
    return text


def _nat_frontends(pin_dir: str, fe_mod: ModuleType, be_mod: ModuleType,
                   aff_mod: ModuleType) -> list[dict]:
    """One family's frontends (fe_mod/be_mod/aff_mod: nat_frontend, nat_backend,
    nat_affinity or their IPv6 twins) as nat_pinned lists them."""
    with (BpfMap.open_pinned(fe_mod.PARAMS, pin_dir) as fe,
          BpfMap.open_pinned(be_mod.PARAMS, pin_dir) as be,
          BpfMap.open_pinned(aff_mod.PARAMS, pin_dir) as aff):
        v6 = fe_mod is nat_frontend6

        def at(addr: str, port: int) -> str:
            return f"[{addr}]:{port}" if v6 else f"{addr}:{port}"

        backends: dict[int, dict[int, str]] = {}
        for row in be_mod.dump(be):
            backends.setdefault(row["service_id"], {})[row["index"]] = at(row["addr"],
                                                                          row["port"])
        affinity: dict[int, list[dict]] = {}
        for row in aff_mod.dump(aff):
            affinity.setdefault(row["service_id"], []).append(
                {"client": row["client"], "backend": at(row["addr"], row["port"]),
                 "last_used_ns": row["last_used_ns"]})
        frontends = []
        for row in fe_mod.dump(fe):
            sid = row["service_id"]
            frontends.append({
                "frontend": f"{at(row['vip'], row['port'])}/{row['protocol']}",
                "family": 6 if v6 else 4,
                "service_id": sid, "flags": row["flags"],
                "affinity_timeout": row["affinity_timeout"],
                # what the programs pick: the frontend's inline copy, then the backend map
                "backends": [at(a, p) for a, p in row["inline_backends"]]
                + [backends.get(sid, {}).get(i, "?")
                   for i in range(len(row["inline_backends"]), row["backends"])],
                "affinity": affinity.get(sid, [])})
        return frontends


def nat_pinned(pin_dir: str) -> dict:
    """`pyfelix bpf nat dump`: the service frontends of both families with their backends
    and affinity entries, and the NAT counters (shared): {"frontends": [{"frontend":
    "VIP:port/proto" (IPv6: "[VIP]:port/proto"), "family": 4|6, "service_id" (per family),
    "flags", "affinity_timeout", "backends": ["addr:port", ...] (IPv4: the first
    nat_frontend.INLINE_BACKENDS from the frontend's own copy, as the programs read them),
    "affinity": [{"client", "backend", "last_used_ns"}]}], "counters": {...}}.
    Raises OSError if a map is not pinned there."""
    frontends = _nat_frontends(pin_dir, nat_frontend, nat_backend, nat_affinity)
    frontends += _nat_frontends(pin_dir, nat_frontend6, nat_backend6, nat_affinity6)
    with BpfMap.open_pinned(nat_counters.PARAMS, pin_dir) as cnt:
        return {"frontends": frontends, "counters": nat_counters.read(cnt)}


def nat_summary_pinned(pin_dir: str) -> dict:
    """Service figures for `pyfelix bpf summary`: frontends, those without backends
    (rejected), backends, NAT flows (nat_ct entries: two per flow)."""
    view = nat_pinned(pin_dir)
    with (BpfMap.open_pinned(nat_ct.PARAMS, pin_dir) as ct,
          BpfMap.open_pinned(nat_ct6.PARAMS, pin_dir) as ct6):
        entries = len(ct.items()) + len(ct6.items())
    fronts = view["frontends"]
    return {"frontends": len(fronts),
            "frontends_without_backends": sum(1 for f in fronts if not f["backends"]),
            "backends": sum(len(f["backends"]) for f in fronts),
            "nat_flows": entries // 2}
