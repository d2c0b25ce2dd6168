"""Build the BPF dataplane's managers: check the kernel, compile ONCE, pin, wire the managers.

Role: `build_bpf_managers(config)` is what `agent.daemon.build_bpf_managers` calls; its
managers go FIRST in the loop's order (policy before plumbing), before the Linux route and
sysctl managers. Steps:

1. the pin directory (`BPFPinDir`, default /sys/fs/bpf/pyfelix) must be on bpffs; if
   /sys/fs/bpf is not mounted it is mounted (a fresh machine has none mounted);
2. BCC must import (Debian's python3-bpfcc, seen through a --system-site-packages venv);
3. `agent.bpf.loader.load_dataplane`: compile tc.c + xdp.c once (seconds), verify, adopt
   the pinned maps of a previous agent (or create and pin them), sized from `BPFMapSize*`;
   a build already compiled on this node with the same source, flags, kernel and BCC loads
   from the build cache instead (agent.bpf.build_cache; PYFELIX_BPF_CACHE_DIR, default
   /var/cache/pyfelix/bpf, "off" disables it): verified again, not compiled. Flow logs
   read BCC's ring buffer, so with FlowLogsFileEnabled the build always compiles;
4. managers, in apply order:
   - `BpfPolicyManager`: the policy maps by difference (managers/bpf_policy.py);
   - `BpfRouteManager`: the routes trie by difference (managers/bpf_routes.py);
   - `BpfNatManager`: the service maps (frontends, backends, affinity) by difference
     (managers/bpf_nat.py); a second, IPv6 one (`family=6`, the `*6` maps) after the
     conntrack manager when Ipv6Support is on;
   - `BpfAttachManager`: tc programs on workload interfaces, XDP for untracked host
     endpoint rules (managers/bpf_attach.py); after the first complete round it sweeps the
     previous builds' private pins;
   - `BpfGuardManager`: the nft guard's set of interfaces running our programs
     (managers/bpf_guard.py; the guard table itself is installed between steps 2 and 3,
     so the compile's seconds are no unpoliced window either);
   - `BpfConntrackManager`: the conntrack cleaner thread (managers/bpf_conntrack.py).

Drop counters (`pyfelix_bpf_dropped_packets_total{reason}`, per-endpoint spoofed packets)
are read at scrape time from the `global_counters` map, the `ep_spoofed` map and the
guard's nft counters (`bpf_metrics.DROPS`).

Failure: any of 1-3 (or the guard) failing raises `DataplaneUnavailable` with a message
saying what is missing (no bpffs, no nft, BCC not importable, compile/verifier failure with
the first lines of the error, bad map size), so the agent exits with it (or falls back, if
BPFFallback=iptables).

Lifetime: the `LoadedDataplane` (BCC object, program fds, map handles) is shared by the
managers and closed when the last of them is closed; programs stay attached and maps stay
pinned (an agent restart adopts them).
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
from collections.abc import Callable
from typing import Any

from pyfelix.agent.bpf import syscall
from pyfelix.agent.bpf.build_cache import BuildCache
from pyfelix.agent.bpf.loader import (
    CTLB_PROGRAMS,
    BuildConfig,
    LoadedDataplane,
    LoaderError,
    load_dataplane,
    resolve_pin_dir,
    sweep_stale_build_pins,
)
from pyfelix.agent.bpf.maps import conntrack as ct_map
from pyfelix.agent.bpf.maps import counters as counters_map
from pyfelix.agent.bpf.maps import nat_counters as nat_counters_map
from pyfelix.agent.bpf.maps.base import BpfMap
from pyfelix.agent.config import Config
from pyfelix.agent.dataplane.errors import DataplaneUnavailable
from pyfelix.agent.dataplane.manager import Manager
from pyfelix.agent.dataplane.managers import bpf_metrics
from pyfelix.agent.dataplane.managers.bpf_attach import BpfAttachManager, ProgramRef
from pyfelix.agent.dataplane.managers.bpf_conntrack import BpfConntrackManager
from pyfelix.agent.dataplane.managers.bpf_ctlb import BpfCtlbManager
from pyfelix.agent.dataplane.managers.bpf_guard import BpfGuardManager
from pyfelix.agent.dataplane.managers.bpf_nat import BpfNatManager
from pyfelix.agent.dataplane.managers.bpf_policy import BpfPolicyManager
from pyfelix.agent.dataplane.managers.bpf_routes import BpfRouteManager
from pyfelix.agent.shims.netlink import netlink_lister
from pyfelix.agent.shims.nft_guard import GuardError, NftGuard

log = logging.getLogger(__name__)

# Felix parameter -> map it sizes
MAP_SIZE_PARAMS = {
    "BPFMapSizeConntrack": "conntrack",
    "BPFMapSizeIPSets": "ipsets",
    "BPFMapSizeRules": "rules",
    "BPFMapSizeRoutes": "routes",
    "BPFMapSizeEndpoints": "endpoints",
    "BPFMapSizeNATFrontend": "nat_frontend",
    "BPFMapSizeNATBackend": "nat_backend",
    "BPFMapSizeNATAffinity": "nat_affinity",
    "BPFMapSizeClassifierWords": "cls_words",
    "BPFMapSizeClassifierTries": "cls_tries",
    "BPFMapSizeClassifierL4": "cls_l4",
}

# IPv4 NAT map -> its IPv6 twin, sized by the same BPFMapSizeNAT* parameter (Felix has one
# setting per NAT map, for both families)
NAT_V6_TWINS = {"nat_frontend": "nat_frontend6", "nat_backend": "nat_backend6",
                "nat_affinity": "nat_affinity6"}


def build_config(config: Config) -> BuildConfig:
    """The loader's BuildConfig from the agent's settings (map sizes checked here, so the
    error names the Felix parameter)."""
    sizes = {}
    for param, map_name in MAP_SIZE_PARAMS.items():
        value = config.get(param)
        if not isinstance(value, int) or value < 1:
            raise DataplaneUnavailable(f"{param}: map size must be a positive integer, "
                                       f"got {value!r}")
        sizes[map_name] = value
        if map_name in NAT_V6_TWINS:  # the IPv6 NAT map takes its IPv4 twin's setting
            sizes[NAT_V6_TWINS[map_name]] = value
    return BuildConfig(pin_dir=str(config.bpf_pin_dir), map_sizes=sizes,
                       ct_timeouts=ct_map.timeouts_from_felix(
                           config.get("BPFConntrackTimeouts")))


def load(build: BuildConfig, *, before_compile: Callable[[], None] | None = None,
         cache: BuildCache | None = None) -> LoadedDataplane:
    """Steps 1-3 of the module docstring; DataplaneUnavailable on any failure.
    `before_compile` runs once the cheap checks passed (the guard: installing it on a node
    that then cannot run BPF mode at all would only cut workloads off)."""
    try:
        build = dataclasses.replace(build, pin_dir=resolve_pin_dir(build.pin_dir))
    except (LoaderError, OSError, subprocess.CalledProcessError) as exc:
        raise DataplaneUnavailable(
            f"BPF dataplane: no bpf filesystem for BPFPinDir {build.pin_dir!r} ({exc}); "
            "mount it with `mount -t bpf bpf /sys/fs/bpf`") from exc
    try:
        import bcc  # noqa: F401  (only to report its absence clearly)
    except ImportError as exc:
        raise DataplaneUnavailable(
            f"BPF dataplane: BCC is not importable ({exc}); install python3-bpfcc and use "
            "a Python that sees it (a venv made with --system-site-packages)") from exc
    if before_compile is not None:
        before_compile()
    try:
        return load_dataplane(build, cache=cache)
    except (LoaderError, ValueError, OSError) as exc:
        first = "\n".join(str(exc).splitlines()[:5])
        raise DataplaneUnavailable(f"BPF dataplane: programs could not be built or loaded "
                                   f"(kernel headers, BTF, verifier?): {first}") from exc


class SharedLoad:
    """Reference-counted owner of a LoadedDataplane: closed when every user released it
    (and then the drop metrics stop reading its maps)."""

    def __init__(self, loaded: LoadedDataplane, users: int) -> None:
        self.loaded = loaded
        self._users = users

    def release(self) -> None:
        self._users -= 1
        if self._users == 0:
            bpf_metrics.DROPS.forget(self.loaded)
            bpf_metrics.POLICY_COUNTERS.forget(self.loaded)
            self.loaded.close()


def program_ref(loaded: LoadedDataplane, name: str) -> ProgramRef:
    fd = loaded.prog_fd(name)
    return ProgramRef(fd=fd, prog_id=syscall.prog_info(fd).prog_id, name=name)


def managers_for(loaded: LoadedDataplane, config: Config) -> list[Manager]:
    """Step 4: the managers over an already loaded build."""
    prefixes = interface_prefixes(config)
    pin_dir = loaded.config.pin_dir
    abi = loaded.abi
    policy = BpfPolicyManager(
        loaded.maps,
        interface_prefixes=prefixes,
        base_config={"DefaultEndpointToHostAction": str(config.default_endpoint_to_host_action),
                     "BPFEnforceRPF": str(config.bpf_enforce_rpf),
                     "BPFRedirectToPeer": str(config.bpf_redirect_to_peer),
                     "BPFConnectTimeLoadBalancing":
                         str(config.bpf_connect_time_load_balancing),
                     "FlowLogsFileEnabled": str(config.flow_logs_file_enabled).lower(),
                     "Ipv6Support": str(config.ipv6support).lower(),
                     "VXLANPort": str(config.vxlan_port),
                     "AllowVXLANPacketsFromWorkloads":
                         str(config.get("AllowVXLANPacketsFromWorkloads")).lower(),
                     "AllowIPIPPacketsFromWorkloads":
                         str(config.get("AllowIPIPPacketsFromWorkloads")).lower()},
        rules_per_prog=loaded.config.rules_per_prog,
        list_interfaces=netlink_lister(),
    )

    def sweep() -> None:
        removed = sweep_stale_build_pins(pin_dir, abi)
        if removed:
            log.info("BPF: removed pins of previous builds: %s", ", ".join(removed))

    attach = BpfAttachManager(
        {"ingress": program_ref(loaded, "calico_from_wep"),
         "egress": program_ref(loaded, "calico_to_wep")},
        program_ref(loaded, "calico_xdp") if config.xdp_enabled else None,
        hep_program=program_ref(loaded, "calico_from_hep"),
        host_program=program_ref(loaded, "calico_from_host"),
        data_iface_pattern=str(config.bpf_data_iface_pattern),
        xdp_modes=("native", "generic") if config.generic_xdp_enabled else ("native",),
        interface_prefixes=prefixes,
        on_all_current=sweep,
    )
    conntrack = BpfConntrackManager(
        lambda: BpfMap.open_pinned(ct_map.PARAMS, pin_dir),
        interval=float(config.bpf_conntrack_cleanup_interval) or 10.0,
        timeouts=loaded.config.ct_timeouts,
    )
    routes = BpfRouteManager(loaded.maps["routes"], interface_prefixes=prefixes,
                             list_interfaces=netlink_lister(), ipv6=config.ipv6support)
    nat = BpfNatManager(loaded.maps["nat_frontend"], loaded.maps["nat_backend"],
                        loaded.maps["nat_affinity"], loaded.maps["nat_vip_filter"])
    guard = BpfGuardManager(attach, interface_prefixes=prefixes)
    ctlb = BpfCtlbManager({name: loaded.prog_fd(name) for name in CTLB_PROGRAMS},
                          mode=str(config.bpf_connect_time_load_balancing),
                          cgroup=str(config.bpf_cgroup_v2))
    global_counters = loaded.maps["global_counters"]
    nat_counters = loaded.maps["nat_counters"]
    bpf_metrics.DROPS.set_sources(
        global_counters=lambda: counters_map.read_globals(global_counters),
        guard=guard.guard.counters,
        spoofed_by_endpoint=policy.spoofed_by_endpoint,
        nat=lambda: nat_counters_map.read(nat_counters), owner=loaded)
    bpf_metrics.POLICY_COUNTERS.set_sources(rules=policy.rule_counters,
                                            denied=policy.denied_sources, owner=loaded)
    managers: list[Any] = [policy, routes, nat, attach, conntrack]
    if config.ipv6support:  # IPv6 Services (nat6.h); Ipv6Support false programs nothing IPv6
        managers.append(BpfNatManager(loaded.maps["nat_frontend6"], loaded.maps["nat_backend6"],
                                      loaded.maps["nat_affinity6"], None, family=6))
    if config.flow_logs_file_enabled:
        from pyfelix.agent.dataplane.managers.flow_logs import FlowLogManager

        managers.append(flow_logs := FlowLogManager(
            loaded.bpf, policy.counter_meta, directory=str(config.flow_logs_file_directory),
            flush_interval=float(config.flow_logs_flush_interval),
            max_bytes=int(config.flow_logs_file_max_file_size_mb) << 20,
            max_files=int(config.flow_logs_file_max_files),
            dropped_events=lambda: counters_map.read_globals(global_counters).get(
                "flow_events_dropped", 0)))
        conntrack.on_expired = flow_logs.on_ct_expired  # flow-end records
    shared = SharedLoad(loaded, len(managers))
    for manager in managers:
        manager.on_close = shared.release
    return [policy, routes, nat, attach, guard, conntrack, ctlb, *managers[5:]]


def interface_prefixes(config: Config) -> tuple[str, ...]:
    return tuple(p for p in str(config.interface_prefix).split(",") if p)


def install_guard(config: Config) -> None:
    """The nft guard before anything else (agent.shims.nft_guard): from here on, workload
    interfaces without our programs forward nothing."""
    try:
        NftGuard().install(interface_prefixes(config))
    except (GuardError, ValueError) as exc:
        raise DataplaneUnavailable(
            f"BPF dataplane: the guard against unprogrammed workload interfaces could not "
            f"be installed ({exc}); install nftables (the `nft` command)") from exc


def build_bpf_managers(config: Config) -> list[Manager]:
    """Check, compile once, pin, and return the BPF managers (see module docstring)."""
    build = build_config(config)
    loaded = load(build, before_compile=lambda: install_guard(config),
                  cache=None if config.flow_logs_file_enabled else BuildCache.from_env())
    log.info("BPF dataplane loaded: abi %s, pins under %s%s", loaded.abi,
             loaded.config.pin_dir,
             f", replaced {loaded.replaced_pins}" if loaded.replaced_pins else "")
    try:
        return managers_for(loaded, config)
    except Exception:
        loaded.close()
        raise
