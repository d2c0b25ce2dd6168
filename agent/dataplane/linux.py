"""Wiring of the Linux dataplane for one network namespace: managers in order, loop, monitor.

Role: the one place that knows the managers' order (Felix's `InternalDataplane` constructor).
The agent (or the lab, for a node namespace) builds a `LinuxDataplane`, starts it, feeds the
calc graph's messages to `enqueue`, waits for `in_sync`, and stops it on shutdown (the
programmed dataplane stays in place, as Felix leaves it on SIGTERM).

Order of a round (phase 1 `apply`, then phase 2 `finish_apply` in the same order):

    extra_managers      (e.g. BPF maps, given by the caller, first: policy before plumbing)
    NflogFlowLogManager iptables mode with FlowLogsFileEnabled: binds the NFLOG groups (and
                        conntrack's destroy events) on its first apply, before the rules
                        logging to them exist, then reads them (its own thread) into
                        flows.log
    IPSetsManager       calc-graph IP sets ... phase 2: destroys unused sets (BPF mode:
                        only the sets host endpoint rules match)
    HostIPsManager      `cali40this-host` from the interface monitor's addresses (both modes)
    IptablesManager     filter/mangle/raw rules referencing those sets: workload and host
                        endpoint policy, failsafes, IPVS awareness, the workloads' source
                        check (raw); and the ip6tables filter table that keeps workload IPv6
                        closed (BPF mode: host endpoints and failsafes only, see below)
    NatOutgoingManager  nat tables (IPv4, and IPv6 with Ipv6Support) + pool IP sets:
                        natOutgoing and floating IPs (both modes: in BPF mode they use the
                        same nat-table rules)
    RouteManager        workload routes (+ static ARP), blackholes for local blocks
    VXLANManager        vxlan.calico device, VTEP FDB/ARP, routes to remote VXLAN blocks
                        (a second one, ip_version=6: vxlan-v6.calico, when Ipv6Support)
    IPIPManager         tunl0 device (address, MTU), routes to remote IPIP blocks onlink
    SysctlManager       forwarding, proxy ARP, rp_filter (0 in BPF mode, and in iptables
                        mode where the endpoint allows spoofed IPv4 sources)
    EndpointStatusManager  up/down per endpoint to a callback (status reporting), when given
    BpfCleanupManager   iptables mode with a pin dir only, LAST: phase 2 of the first round
                        after in-sync (once per process) detaches the tc filters and XDP
                        program an earlier BPF-mode agent left in this namespace (ours only,
                        by name), its nft guard table, and its pin directory; the chains
                        are in place by then (make before break)

BPF mode: the split between the tc/XDP programs and iptables.

    workload interfaces       BPF only. The tc programs apply the pods' ingress/egress policy
                              and profiles, and DefaultEndpointToHostAction to pod->host
                              packets (Drop drops there; Return behaves as Accept). iptables
                              has no workload dispatch or endpoint chains, and its rules never
                              judge a packet by a workload interface: cali-FORWARD has no
                              workload rules at all (pod traffic not crossing a host endpoint
                              with applyOnForward policy passes on to FORWARD's own rules),
                              and cali-INPUT hands pod->host packets back (RETURN), or
                              ACCEPTs them when the action is Accept, as in iptables mode.
    host endpoints            iptables (`IptablesManager(host_endpoints_only=True)`): filter
                              INPUT/OUTPUT (normal policy and profiles) and FORWARD
                              (applyOnForward), mangle PREROUTING (preDNAT), raw
                              PREROUTING/OUTPUT (doNotTrack), failsafes first in every table,
                              the VXLAN source rules. Only the policies and profiles host
                              endpoints list are rendered, and only the IP sets their rules
                              match are programmed. The XDP program additionally drops the
                              leading source-only doNotTrack denies early (a subset of what
                              the raw table decides, so the two never disagree).
    NAT outgoing, routes, VXLAN, host IPs, sysctls: the same managers as in iptables mode.

Switching modes: from BPF to iptables, `BpfCleanupManager` (managers/bpf_cleanup.py)
removes the BPF agent's programs and pins once the chains are programmed (it needs
`bpf_pin_dir`, which the agent always passes: `BPFPinDir`); the other way, the first apply
after in-sync sweeps the workload chains and the IP sets no rule uses any more.

Known BPF-mode limit: kube-proxy IPVS awareness (the iptables mode's rules that keep
IPVS-forwarded pod traffic out of host endpoint egress policy) is not rendered, since it
rests on the workload chains' marks.

Settings: `agent.config` parses Felix's names (`FelixConfiguration` / `FELIX_*`) once and
names a bad value there; `LinuxDataplaneConfig.from_config` takes the parsed result.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyfelix.agent.config import DEFAULT_FAILSAFE_IN, DEFAULT_FAILSAFE_OUT, Config
from pyfelix.agent.dataplane.ifacemonitor import InterfaceMonitor
from pyfelix.agent.dataplane.iptables.hostendpoints import Failsafes, parse_failsafe_ports
from pyfelix.agent.dataplane.loop import DataplaneLoop
from pyfelix.agent.dataplane.manager import Manager
from pyfelix.agent.dataplane.managers.bpf_cleanup import BpfCleanupManager
from pyfelix.agent.dataplane.managers.bpf_ctlb import detach_ctlb_programs
from pyfelix.agent.dataplane.managers.endpoint_status import EndpointStatusManager, Report
from pyfelix.agent.dataplane.managers.flow_logs import NflogFlowLogManager
from pyfelix.agent.dataplane.managers.hostips import HostIPsManager, InterfaceMatcher
from pyfelix.agent.dataplane.managers.ipip import IPIPManager
from pyfelix.agent.dataplane.managers.ipsets import IPSetsManager
from pyfelix.agent.dataplane.managers.iptables import IptablesManager
from pyfelix.agent.dataplane.managers.nat import NatOutgoingManager
from pyfelix.agent.dataplane.managers.routes import ROUTE_PROTOCOL, RouteManager
from pyfelix.agent.dataplane.managers.sysctls import SysctlManager
from pyfelix.agent.dataplane.managers.vxlan import DEFAULT_PORT, DEFAULT_VNI, VXLANManager
from pyfelix.agent.shims.nft_guard import NftGuard


@dataclass(frozen=True)
class LinuxDataplaneConfig:
    interface_prefixes: tuple[str, ...] = ("cali",)  # InterfacePrefix (comma-separated)
    bpf_mode: bool = False  # BPFEnabled
    endpoint_to_host_action: str = "Drop"  # DefaultEndpointToHostAction
    iptables_backend: str = "auto"  # IptablesBackend: Auto | NFT | Legacy
    max_ipset_size: int = 1048576  # MaxIpsetSize
    resync_interval: float = 180.0  # IptablesRefreshInterval (Felix: 180 s)
    interface_refresh_interval: float = 90.0  # InterfaceRefreshInterval
    fail_closed_after: float = 60.0  # DataplaneFailClosedAfter: policy failing this long: exit
    failsafe_inbound: tuple[tuple[str, int], ...] = parse_failsafe_ports(DEFAULT_FAILSAFE_IN)
    failsafe_outbound: tuple[tuple[str, int], ...] = parse_failsafe_ports(DEFAULT_FAILSAFE_OUT)
    interface_exclude: str = "kube-ipvs0"  # InterfaceExclude: names or /regex/, comma-separated
    vxlan_vni: int = DEFAULT_VNI  # VXLANVNI
    vxlan_port: int = DEFAULT_PORT  # VXLANPort
    vxlan_mtu: int = 0  # VXLANMTU (0: the parent interface's MTU - 50)
    vxlan_mtu_v6: int = 0  # VXLANMTUV6 (0: the parent interface's MTU - 70)
    ipip_enabled: bool | None = None  # IpInIpEnabled (None: follow the IP pools)
    ipip_mtu: int = 0  # IpInIpMtu (0: the parent interface's MTU - 20)
    ipip_tunnel_addr: str = ""  # IpInIpTunnelAddr (overrides the Node's / derived address)
    floating_ips: bool = False  # FloatingIPs: Enabled programs the endpoints' ipNATs
    allow_vxlan_from_workloads: bool = False  # AllowVXLANPacketsFromWorkloads
    allow_ipip_from_workloads: bool = False  # AllowIPIPPacketsFromWorkloads
    route_protocol: int = ROUTE_PROTOCOL  # RouteTableProtocol: marks the workload routes ours
    # BPFPinDir: where a BPF-mode agent pins its maps. In iptables mode, set: a
    # BpfCleanupManager removes that agent's programs and pins; None (the default here, for
    # tests and tools that build a namespace's dataplane directly): no cleanup at all.
    bpf_pin_dir: str | None = None
    bpf_cgroup_v2: str = ""  # BPFCgroupV2: where a BPF-mode agent attached its cgroup programs
    ipv6_support: bool = True  # Ipv6Support: False polices, routes and forwards no IPv6
    # FlowLogsFileEnabled -> FlowLogsFileDirectory ("" = off). iptables mode: NFLOG rules and
    # an NflogFlowLogManager; BPF mode: the BPF managers bring their own reader.
    flow_logs_directory: str = ""
    flow_logs_flush_interval: float = 300.0  # FlowLogsFlushInterval
    flow_logs_max_bytes: int = 100 << 20  # FlowLogsFileMaxFileSizeMB
    flow_logs_max_files: int = 5  # FlowLogsFileMaxFiles

    def __post_init__(self) -> None:
        if not 0 < self.vxlan_vni < 1 << 24:
            raise ValueError(f"VXLANVNI: {self.vxlan_vni} is not 1..16777215")
        if not 0 < self.vxlan_port < 65536:
            raise ValueError(f"VXLANPort: {self.vxlan_port} is not 1..65535")
        if self.vxlan_mtu and not 68 <= self.vxlan_mtu <= 65535:
            raise ValueError(f"VXLANMTU: {self.vxlan_mtu} is not 0 (auto) or 68..65535")

    @classmethod
    def from_config(cls, config: Config, *, bpf_mode: bool) -> LinuxDataplaneConfig:
        """The agent's validated settings (`agent.config`: Felix's names, parsed once, each
        bad value named there) in the form the managers take."""
        return cls(
            interface_prefixes=tuple(p for p in config.interface_prefix.split(",") if p),
            bpf_mode=bpf_mode,
            endpoint_to_host_action=config.default_endpoint_to_host_action,
            iptables_backend=config.iptables_backend.lower(),
            max_ipset_size=config.bpf_map_size_ip_sets,
            resync_interval=config.iptables_refresh_interval,
            fail_closed_after=config.dataplane_fail_closed_after,
            failsafe_inbound=config.failsafe_inbound_host_ports,
            failsafe_outbound=config.failsafe_outbound_host_ports,
            interface_exclude=config.interface_exclude,
            vxlan_vni=config.vxlanvni,
            vxlan_port=config.vxlan_port,
            vxlan_mtu=config.vxlanmtu,
            vxlan_mtu_v6=config.get("VXLANMTUV6"),
            ipip_enabled={"true": True, "false": False}.get(config.ip_in_ip_enabled),
            ipip_mtu=config.ip_in_ip_mtu,
            ipip_tunnel_addr=config.ip_in_ip_tunnel_addr,
            floating_ips=config.get("FloatingIPs") == "Enabled",
            allow_vxlan_from_workloads=config.get("AllowVXLANPacketsFromWorkloads"),
            allow_ipip_from_workloads=config.get("AllowIPIPPacketsFromWorkloads"),
            bpf_pin_dir=config.bpf_pin_dir,
            bpf_cgroup_v2=str(config.bpf_cgroup_v2),
            route_protocol=config.route_table_protocol,
            ipv6_support=config.ipv6support,
            flow_logs_directory=(str(config.flow_logs_file_directory)
                                 if config.flow_logs_file_enabled else ""),
            flow_logs_flush_interval=float(config.flow_logs_flush_interval),
            flow_logs_max_bytes=int(config.flow_logs_file_max_file_size_mb) << 20,
            flow_logs_max_files=int(config.flow_logs_file_max_files),
        )


def linux_managers(cfg: LinuxDataplaneConfig, *, netns: str | None = None,
                   extra_managers: Sequence[Manager] = (),
                   endpoint_status: Report | None = None) -> list[Manager]:
    """The managers of one namespace's dataplane, in the order a round applies them.

    `endpoint_status(kind, endpoint id, status | None)`: when given (EndpointReportingEnabled),
    an `EndpointStatusManager` reports each endpoint's up/down/error. In iptables mode with
    `cfg.bpf_pin_dir` set, a `BpfCleanupManager` comes last of all."""
    managers: list[Manager] = list(extra_managers)
    iptables = IptablesManager(
        netns=netns,
        interface_prefixes=cfg.interface_prefixes,
        endpoint_to_host_action=cfg.endpoint_to_host_action,
        backend=cfg.iptables_backend,
        failsafes=Failsafes(cfg.failsafe_inbound, cfg.failsafe_outbound),
        vxlan_port=cfg.vxlan_port,
        host_endpoints_only=cfg.bpf_mode,
        ipv6_policy=cfg.ipv6_support,
        allow_vxlan_from_workloads=cfg.allow_vxlan_from_workloads,
        allow_ipip_from_workloads=cfg.allow_ipip_from_workloads,
        flow_logs=bool(cfg.flow_logs_directory) and not cfg.bpf_mode,
    )
    if cfg.flow_logs_directory and not cfg.bpf_mode:
        # before the iptables manager: its first apply binds the NFLOG groups before the
        # rules that log to them exist
        managers.append(NflogFlowLogManager(
            directory=cfg.flow_logs_directory, flush_interval=cfg.flow_logs_flush_interval,
            max_bytes=cfg.flow_logs_max_bytes, max_files=cfg.flow_logs_max_files,
            netns=netns))
    managers += [
        IPSetsManager(netns=netns, max_size=cfg.max_ipset_size,
                      only=iptables.referenced_ip_sets if cfg.bpf_mode else None,
                      families=(4, 6) if cfg.ipv6_support else (4,)),
        HostIPsManager(netns=netns, exclude=InterfaceMatcher.parse(cfg.interface_exclude),
                       workload_prefixes=cfg.interface_prefixes),
        iptables,
    ]
    # NAT outgoing in both modes: in BPF mode it uses the same nat-table rules.
    managers.append(NatOutgoingManager(netns=netns, backend=cfg.iptables_backend,
                                       floating_ips=cfg.floating_ips,
                                       ipv6=cfg.ipv6_support))
    managers += [
        RouteManager(netns=netns, interface_prefixes=cfg.interface_prefixes,
                     protocol=cfg.route_protocol, ipv6=cfg.ipv6_support,
                     floating_ips=cfg.floating_ips),
        VXLANManager(netns=netns, vni=cfg.vxlan_vni, port=cfg.vxlan_port, mtu=cfg.vxlan_mtu),
    ]
    if cfg.ipv6_support:  # Felix's second VXLAN manager: vxlan-v6.calico for IPv6 pools
        managers.append(VXLANManager(netns=netns, vni=cfg.vxlan_vni, port=cfg.vxlan_port,
                                     mtu=cfg.vxlan_mtu_v6, ip_version=6))
    managers += [
        IPIPManager(netns=netns, enabled=cfg.ipip_enabled, mtu=cfg.ipip_mtu,
                    tunnel_addr=cfg.ipip_tunnel_addr),
        SysctlManager(netns=netns, interface_prefixes=cfg.interface_prefixes,
                      bpf_mode=cfg.bpf_mode, ipv6=cfg.ipv6_support),
    ]
    if endpoint_status is not None:
        managers.append(EndpointStatusManager(endpoint_status))
    if not cfg.bpf_mode and cfg.bpf_pin_dir is not None:
        # last: its finish_apply runs after every other manager's, once the chains are in
        # place (make before break); it never imports bcc
        managers.append(BpfCleanupManager(
            cfg.bpf_pin_dir, netns=netns, remove_guard=NftGuard(netns=netns).remove,
            detach_ctlb=functools.partial(detach_ctlb_programs, cfg.bpf_cgroup_v2)))
    return managers


class LinuxDataplane:
    """Managers + driver loop + interface monitor for one namespace (None: our own): the
    one assembly the agent (`agent.daemon`) and the tests run.

    `managers`: the managers in round order (the agent's mode selection builds them, BPF
    managers first); by default `linux_managers(config, ...)` builds them from `config`.
    `heartbeat`/`monitor_heartbeat` are called from the loop's and the monitor's own
    threads (the agent's liveness reporters); `monitor_interfaces=False` runs without an
    interface monitor (a tool or test that feeds interface messages itself)."""

    def __init__(
        self,
        *,
        netns: str | None = None,
        config: LinuxDataplaneConfig | None = None,
        managers: Sequence[Manager] | None = None,
        extra_managers: Sequence[Manager] = (),
        on_fatal: Callable[[str], None] | None = None,
        endpoint_status: Report | None = None,
        resync_interval: float | None = None,
        interface_refresh_interval: float | None = None,
        monitor_interfaces: bool = True,
        heartbeat: Callable[[], None] | None = None,
        heartbeat_interval: float = 10.0,
        monitor_heartbeat: Callable[[], None] | None = None,
    ) -> None:
        cfg = config or LinuxDataplaneConfig()
        if managers is None:
            managers = linux_managers(cfg, netns=netns, extra_managers=extra_managers,
                                      endpoint_status=endpoint_status)
        self.managers: list[Manager] = list(managers)
        self.loop = DataplaneLoop(
            self.managers,
            resync_interval=cfg.resync_interval if resync_interval is None else resync_interval,
            fail_closed_after=cfg.fail_closed_after, on_fatal=on_fatal,
            heartbeat=heartbeat, heartbeat_interval=heartbeat_interval)
        self.monitor: InterfaceMonitor | None = None
        if monitor_interfaces:
            self.monitor = InterfaceMonitor(
                self.loop.enqueue, netns=netns, heartbeat=monitor_heartbeat,
                resync_interval=(cfg.interface_refresh_interval
                                 if interface_refresh_interval is None
                                 else interface_refresh_interval))
        self.in_sync = self.loop.in_sync
        self.fatal = self.loop.fatal

    def enqueue(self, msg: object) -> None:
        self.loop.enqueue(msg)

    def start(self) -> None:
        self.loop.start()
        if self.monitor is not None:
            self.monitor.start()

    def stop(self) -> None:
        """Stop the threads and release kernel handles; programmed state stays in place."""
        if self.monitor is not None:
            self.monitor.stop()
        self.loop.stop()
        for manager in self.managers:
            manager.close()
