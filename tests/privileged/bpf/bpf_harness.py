"""Drive the real BPF programs from tests: compile state into the pinned maps, run packets.

`Harness` owns a PolicyState and a PolicyCompiler, writes the compiled result into the
maps of the session's LoadedDataplane (a minimal full sync: desired entries written,
everything else deleted), and runs packets through calico_from_wep / calico_to_wep /
calico_xdp with BPF_PROG_TEST_RUN inside the session's test namespace (whose dummy
interfaces give the ifindexes endpoints are keyed by).
"""

from __future__ import annotations

from typing import Any

from pyfelix.agent import proto as p
from pyfelix.agent.bpf.compiler import CompiledDataplane, PolicyCompiler, PolicyState
from pyfelix.agent.bpf.loader import LoadedDataplane
from pyfelix.agent.bpf.maps import counters as counters_map
from pyfelix.agent.bpf.maps.base import ARRAY_TYPES, BpfMap
from pyfelix.agent.bpf.route_table import RouteInputs, compile_routes
from pyfelix.agent.bpf.testrun import TC_ACT_OK, TC_ACT_SHOT, NetnsThread, run_tc, run_xdp

HOOK_PROGRAMS = {"from": "calico_from_wep", "to": "calico_to_wep"}
DEFAULT_ADDRESSES = {"d1": ("10.65.0.1/32",), "d2": ("10.65.0.2/32",)}


def reset_maps(dp: LoadedDataplane) -> None:
    """Empty every data map (arrays: zeroed entries that were non-zero)."""
    for m in dp.maps.values():
        if m.params.map_type in ARRAY_TYPES:
            dirty = [(k, bytes(m.value_blob_size)) for k, v in m.items() if any(v)]
            m.update_many(dirty)
        else:
            m.delete_many(list(m.iter_keys()))


def sync_map(m: BpfMap, desired: dict[bytes, bytes]) -> None:
    if m.params.map_type not in ARRAY_TYPES:
        stale = [k for k in m.iter_keys() if k not in desired]
        m.delete_many(stale)
    m.update_many(desired.items())


class Harness:
    def __init__(self, dp: LoadedDataplane, ns: NetnsThread, ifindexes: dict[str, int]) -> None:
        self.dp = dp
        self.ns = ns
        self.ifindexes = ifindexes
        self.state = PolicyState(hostname="node1")
        self.route_inputs = RouteInputs(hostname="node1")
        self.compiler = PolicyCompiler(
            rules_capacity=dp.maps["rules"].max_entries,
            rule_counters=dp.maps["rule_counters"].max_entries,
            endpoint_counters=dp.maps["ep_counters"].max_entries,
            cls_words=dp.maps["cls_words"].max_entries,
            cls_tries=dp.maps["cls_tries"].max_entries,
            cls_l4=dp.maps["cls_l4"].max_entries,
        )
        self.last: CompiledDataplane | None = None

    # programming

    def apply(self, *msgs: Any) -> CompiledDataplane:
        for msg in msgs:
            self.state.apply(msg)
            self.route_inputs.apply(msg)
        out = self.compiler.compile(self.state, self.ifindexes)
        maps = self.dp.maps
        sync_map(maps["ids"], out.ids)
        sync_map(maps["ipsets"], out.ipsets)
        sync_map(maps["rules"], out.all_rules())
        maps["cls_words"].update_many(out.cls_words().items())
        sync_map(maps["cls_l4"], out.cls_l4)
        sync_map(maps["cls_tries"], out.cls_tries)
        maps["cls_chains"].update_many(out.cls_chains.items())
        sync_map(maps["wep_sources"], out.wep_sources)
        sync_map(maps["endpoints"], out.endpoints)
        sync_map(maps["routes"], compile_routes(self.route_inputs, self.ifindexes, []))
        sync_map(maps["untracked"], out.untracked)
        sync_map(maps["config"], out.config)
        self.compiler.commit(out)
        self.last = out
        return out

    def endpoint(self, name: str, iface: str, *, tiers: tuple[p.TierInfo, ...] = (),
                 profiles: tuple[str, ...] = (), state: str = "active",
                 ipv4: tuple[str, ...] | None = None, ipv6: tuple[str, ...] = (),
                 allow_spoofed: tuple[str, ...] = ()) -> p.WorkloadEndpointUpdate:
        """An endpoint on `iface`; its addresses default to the tests' convention (d1 is
        10.65.0.1, d2 10.65.0.2), which the source check makes the only ones it may send
        from (with `allow_spoofed`)."""
        if ipv4 is None:
            ipv4 = DEFAULT_ADDRESSES.get(iface, ())
        return p.WorkloadEndpointUpdate(
            p.WorkloadEndpointID("k8s", f"default/{name}", "eth0"),
            p.WorkloadEndpoint(state=state, name=iface, profile_ids=profiles, tiers=tiers,
                               ipv4_nets=ipv4, ipv6_nets=ipv6,
                               allow_spoofed_source_prefixes=allow_spoofed))

    # running packets

    def run(self, hook: str, pkt: bytes, iface: str, repeat: int = 1):
        fd = self.dp.prog_fd(HOOK_PROGRAMS[hook])
        return self.ns.call(run_tc, fd, pkt, ifindex=self.ifindexes[iface], repeat=repeat)

    def verdict(self, hook: str, pkt: bytes, iface: str = "d1") -> str:
        rv = self.run(hook, pkt, iface).retval
        assert rv in (TC_ACT_OK, TC_ACT_SHOT), rv
        return "allow" if rv == TC_ACT_OK else "deny"

    def run_named(self, program: str, pkt: bytes, iface: str) -> str:
        """Verdict of the tc program `program` on `pkt` arriving on `iface`."""
        fd = self.dp.prog_fd(program)
        rv = self.ns.call(run_tc, fd, pkt, ifindex=self.ifindexes[iface]).retval
        assert rv in (TC_ACT_OK, TC_ACT_SHOT), rv
        return "allow" if rv == TC_ACT_OK else "deny"

    def xdp(self, pkt: bytes, iface: str) -> int:
        fd = self.dp.prog_fd("calico_xdp")
        return self.ns.call(run_xdp, fd, pkt, ingress_ifindex=self.ifindexes[iface]).retval

    # counters

    def globals(self) -> dict[str, int]:
        return counters_map.read_globals(self.dp.maps["global_counters"])

    def rule_counter(self, name: str) -> tuple[int, int]:
        number = self.compiler.rule_ids.get(name)
        assert number, f"no counter for {name!r}"
        return counters_map.read_rule(self.dp.maps["rule_counters"], number)

    def endpoint_counters(self, name: str) -> dict[str, dict[str, int]]:
        number = self.compiler.endpoint_ids.get(f"k8s/default/{name}/eth0")
        assert number, f"no endpoint id for {name!r}"
        counts = counters_map.read_endpoint(self.dp.maps["ep_counters"], number)
        packets, nbytes = counters_map.read_rule(self.dp.maps["ep_spoofed"], number)
        counts["spoofed"] = {"packets": packets, "bytes": nbytes}
        return counts
