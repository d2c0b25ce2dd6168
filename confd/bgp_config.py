"""The BIRD configuration model: every decision confd makes, computed in Python.

Role: turn a `BGPState` snapshot and a hostname into a `BirdConfig` (frozen dataclasses) that
the jinja2 templates print without deciding anything.

Inputs: `bgp_view.BGPState` (validated BGPConfiguration, Node, BGPPeer, IPPool, BlockAffinity),
the node name, the workload interface prefix (Felix's InterfacePrefix, default `cali`).
Output: `BirdConfig`: the global settings, and per IP family a `FamilyConfig` (its BIRD
channel, filters, kernel protocol, static routes and BGP sessions; IPv4 always, IPv6 when
this Node has `spec.bgp.ipv6Address`: IPv6 mesh sessions between nodes that both have one,
IPv6 peers, pools, blocks and service CIDRs, all with the same rules as IPv4 below, and
names suffixed "6"). `ConfdError` when this node cannot run BGP at all (no Node resource,
no `spec.bgp.ipv4Address`, or the global BGPConfiguration / this Node failed validation);
anything narrower (one bad peer, one bad community) is skipped and recorded in
`BirdConfig.notes`, rendered as comments, and logged by the caller.

What is exported to BGP peers (the `pyfelix_export_rules` function, first match wins):
1. our service routes (static blackholes for serviceClusterIPs / serviceExternalIPs /
   serviceLoadBalancerIPs of the `default` BGPConfiguration; and, as Calico's confd, a /32
   (/128) for each IP of an `externalTrafficPolicy: Local` service that has a ready
   endpoint on THIS node (EndpointSlice endpoint with nodeName = this node): its cluster
   IPs when serviceClusterIPs is set, its external / load balancer IPs inside those
   ranges; withdrawn when the last such endpoint goes);
2. this node's IPAM blocks: BlockAffinity resources with `node` = this node, state
   `confirmed`, not `deleted`, inside an exported pool: the block itself is exported (BIRD
   originates it as a static blackhole route) and every more specific route inside it is
   NOT (the /32s of our own pods are covered by the block);
3. the family's pools, most specific first: routes inside an enabled pool are exported (the /32s the
   kernel protocol learns for pods whose IP is outside our blocks, blocks learned from peers
   when this node reflects or transits them); routes inside a pool that is `disabled`, has
   `disableBGPExport`, or uses VXLAN (Felix programs VXLAN routes itself) are not;
4. nothing else.
The kernel protocol imports ("learns") only kernel routes inside enabled pools, and programs
every BGP route into the kernel except those inside VXLAN and IPIP pools (the agent programs
those itself: via vxlan.calico, or via tunl0 onlink - Calico's BIRD does the latter with
its `krt_tunnel` extension, which stock BIRD lacks, so here the agent's IPIP manager does it,
as Felix does with ProgramClusterRoutes), device routes and our service blackholes.
Communities from `prefixAdvertisements` are added to matching routes.

Mesh rule (as Calico's template): with nodeToNodeMeshEnabled (default true) this node peers
with every other Node that has `bgp.ipv4Address`, each with its own AS (node `asNumber`, else
the global one, else 64512); of each pair only the node with the higher address connects:
the lower one is `passive` (Calico compares the strings; we compare addresses). IPv6: the
same over `bgp.ipv6Address`, between the nodes that have one. The router id is always the
IPv4 address.

Peers: a BGPPeer applies to this node if `node` names it, or `nodeSelector` matches its
labels, or it has neither (a global peer). Targets are `peerIP` (with `asNumber`) or every
other Node matching `peerSelector`; a peerSelector peering is symmetric (as in Calico): a
node matching `peerSelector` peers back with every other node the BGPPeer applies to. One
session per neighbor address; priority node-specific > global > mesh, later duplicates are
dropped with a note. This node is a route reflector if its Node has
`routeReflectorClusterID`: an iBGP peer that is not a reflector of the same cluster is then
its `rr client`. Also rendered: `ttlSecurity` (GTSM: `ttl security on; multihop N`),
`reachableBy` (a static route to the peer through that gateway), `bindMode: NodeIP`
(`strict bind` on every session), listenPort (local port of every session, and the mesh
neighbors' port).

BGPFilter (BGPPeer `spec.filters`, as Calico's confd renders them): per valid BGPFilter,
direction and family with rules, one BIRD function ('pyfelix_bgpfilter_<name>_import4'...)
whose statements test the rule's matches (cidr with Equal `=`, NotEqual `!=`, In `~`,
NotIn `!~`; prefixLength as a prefix set `[ cidr{min,max} ]`; source RemotePeers as
`source = RTS_BGP`; interface as `ifname ~ "pattern"`; all given must hold) and accept or
reject, which ends the whole filter. A peer's sessions call its filters' functions in
spec.filters order, then the default: import accepts, export applies
`pyfelix_export_rules` (the rules above, which the plain `pyfelix_export_to_bgp` filter
also calls). A peer naming a BGPFilter that is missing or invalid is not rendered (its
routes would pass unfiltered), with a note.

Passwords (BGPPeer `spec.password`, BGPConfiguration `spec.nodeMeshPassword`): inline
`value`, or `secretKeyRef` {name, key}: that key of the v1 Secret of that name in the
secret namespace (`BGPState.secrets`, see bgp_view). Fail closed: a Secret or key that is
missing, an empty value, a value BIRD strings cannot hold or one over 80 bytes means the
peer (or the mesh) is not rendered at all, with a note naming the peer and the Secret; never
a session that could come up unauthenticated. Notes and errors name Secrets and keys, never
values; `BGPSession.password` is kept out of repr().

Easy to get wrong: BIRD strings have no escapes, so a password containing `"`, `\\` or a
line break is refused (as above: the peer is not rendered).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyfelix.agent.model import (
    BGPConfiguration,
    BGPFilter,
    BGPFilterRule,
    BGPPeer,
    IPPool,
    Metadata,
    Node,
    SecretKeyRef,
)
from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.confd.bgp_view import BGPState

DEFAULT_AS_NUMBER = 64512
DEFAULT_BGP_PORT = 179
DEFAULT_INTERFACE_PREFIX = "cali"
DEFAULT_HOLD_TIME = 240  # BIRD's default; keepalive must stay below a third of it
MAX_GRACEFUL_RESTART_TIME = 4095  # 12-bit field of the BGP graceful restart capability
SERVICES_PROTOCOL = "pyfelix_services"
GLOBAL_CONFIG_NAME = "default"
MAX_PASSWORD_BYTES = 80  # TCP_MD5SIG_MAXKEYLEN; Calico's docs: at most 80 characters

# logSeverityScreen -> (BIRD log classes, `debug protocols` setting)
_LOG_LEVELS: dict[str, tuple[str, str]] = {
    "trace": ("all", "all"),
    "debug": ("all", "all"),
    "info": ("{ info, remote, warning, error, auth, fatal, bug }", "{ states }"),
    "warning": ("{ remote, warning, error, auth, fatal, bug }", "off"),
    "error": ("{ error, auth, fatal, bug }", "off"),
    "fatal": ("{ fatal, bug }", "off"),
    "panic": ("{ fatal, bug }", "off"),
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6,
                   "ns": 1e-9}
_INTERFACE_PREFIX = re.compile(r"[A-Za-z0-9_.-]{1,14}")  # fullmatch only


class ConfdError(ValueError):
    """This node cannot get a BIRD configuration; the message names resource and field."""


# --------------------------------------------------------------------------------------------
# The model the templates print


@dataclass(frozen=True)
class LogSettings:
    classes: str  # "all" or "{ info, warning, ... }"
    debug_protocols: str  # "all", "off" or "{ states }"


@dataclass(frozen=True)
class PrefixRule:
    """`if ( net = cidr )` (exact) or `if ( net ~ cidr )` then accept/reject."""

    cidr: str
    exact: bool
    accept: bool
    reason: str

    @property
    def operator(self) -> str:
        return "=" if self.exact else "~"

    @property
    def action(self) -> str:
        return "accept" if self.accept else "reject"


@dataclass(frozen=True)
class CommunityTagging:
    """Communities added to exported routes inside `cidr` (BIRD pair / triple literals)."""

    cidr: str
    communities: tuple[str, ...]  # "(65001, 100)"
    large_communities: tuple[str, ...]  # "(65001, 100, 200)"


@dataclass(frozen=True)
class FilterFunction:
    """A BGPFilter's rules for one direction and family, as a BIRD function: each statement
    accepts or rejects (ending the whole filter) when its conditions hold; none holding
    falls through to the next filter, then to the default (import: accept; export:
    `pyfelix_export_rules`)."""

    name: str  # a quoted BIRD symbol: 'pyfelix_bgpfilter_<name>_import4'
    comment: str  # "BGPFilter(name): importV4"
    statements: tuple[str, ...]  # "if ( (net ~ 10.0.0.0/16) ) then accept;", "reject;"


@dataclass(frozen=True)
class BGPSession:
    protocol_name: str  # Mesh_/Node_/Global_ + address with underscores
    comment: str  # where it comes from
    source: str  # the resource it comes from ("BGPPeer(x)", "BGPConfiguration(default)")
    neighbor_ip: str
    neighbor_port: int | None  # None: BIRD's default 179
    neighbor_as: int
    local_ip: str | None  # None: BIRD picks the source address
    local_port: int | None  # None: listen on 179
    local_as: int
    passive: bool = False
    password: str | None = field(default=None, repr=False)  # never shown by repr/logs
    next_hop_keep: bool = False
    rr_cluster_id: str | None = None  # set: the neighbor is our route reflector client
    graceful_restart_time: int | None = None
    keepalive_time: int | None = None
    hold_time: int | None = None
    ttl_security_hops: int | None = None  # GTSM: `ttl security on` + `multihop N`
    strict_bind: bool = False  # bindMode NodeIP: listen on the node address only
    import_functions: tuple[str, ...] = ()  # BGPFilter functions, in spec.filters order
    export_functions: tuple[str, ...] = ()


@dataclass(frozen=True)
class PeerRoute:
    """A static route to a BGP peer through a gateway (BGPPeer `reachableBy`)."""

    cidr: str
    gateway: str
    comment: str


@dataclass(frozen=True)
class ServiceRoute:
    """A /32 (/128) of an externalTrafficPolicy Local service with a ready endpoint on this
    node, originated (blackhole) and advertised by this node only."""

    cidr: str
    comment: str  # "Service(ns/name) cluster IP"


@dataclass(frozen=True)
class FamilyConfig:
    """What BIRD does for one IP family: its channel (`ipv4` / `ipv6`), filters, kernel
    protocol, static routes and BGP sessions. IPv6 names carry the suffix "6"
    (`pyfelix_export_to_bgp6`, `pyfelix_kernel6`...); IPv4 names have none."""

    version: int  # 4 or 6
    kernel_import: tuple[PrefixRule, ...]
    kernel_export_rejects: tuple[PrefixRule, ...]
    local_blocks: tuple[str, ...]
    service_cidrs: tuple[str, ...]
    community_tagging: tuple[CommunityTagging, ...]
    export_rules: tuple[PrefixRule, ...]
    sessions: tuple[BGPSession, ...]
    peer_routes: tuple[PeerRoute, ...]
    filter_functions: tuple[FilterFunction, ...] = ()
    service_routes: tuple[ServiceRoute, ...] = ()

    @property
    def channel(self) -> str:
        return f"ipv{self.version}"

    @property
    def suffix(self) -> str:
        return "" if self.version == 4 else "6"

    @property
    def services_protocol(self) -> str:
        return SERVICES_PROTOCOL + self.suffix


@dataclass(frozen=True)
class BirdConfig:
    hostname: str
    router_id: str
    as_number: int
    log: LogSettings
    workload_interface_pattern: str  # "cali*", excluded from the direct protocol
    families: tuple[FamilyConfig, ...]  # IPv4, then IPv6 when this node has ipv6Address
    notes: tuple[str, ...]

    @property
    def ipv4(self) -> FamilyConfig:
        return self.families[0]

    @property
    def ipv6(self) -> FamilyConfig | None:
        return self.families[1] if len(self.families) > 1 else None

    # the IPv4 parts under their own names (most tests and callers look at IPv4)
    @property
    def kernel_import(self) -> tuple[PrefixRule, ...]:
        return self.ipv4.kernel_import

    @property
    def kernel_export_rejects(self) -> tuple[PrefixRule, ...]:
        return self.ipv4.kernel_export_rejects

    @property
    def local_blocks(self) -> tuple[str, ...]:
        return self.ipv4.local_blocks

    @property
    def service_cidrs(self) -> tuple[str, ...]:
        return self.ipv4.service_cidrs

    @property
    def community_tagging(self) -> tuple[CommunityTagging, ...]:
        return self.ipv4.community_tagging

    @property
    def export_rules(self) -> tuple[PrefixRule, ...]:
        return self.ipv4.export_rules

    @property
    def peer_routes(self) -> tuple[PeerRoute, ...]:
        return self.ipv4.peer_routes

    @property
    def sessions(self) -> tuple[BGPSession, ...]:
        """Every session, IPv4 then IPv6."""
        return tuple(s for family in self.families for s in family.sessions)

    @property
    def services_protocol(self) -> str:
        return SERVICES_PROTOCOL


# --------------------------------------------------------------------------------------------
# Helpers


Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address_field(family: int) -> str:
    return f"spec.bgp.ipv{family}Address"


def _address_of_node(node: Node, family: int) -> Address | None:
    """The node's BGP address of one family (ipv4Address / ipv6Address), or None."""
    if node.bgp is None:
        return None
    text = node.bgp.ipv4_address if family == 4 else node.bgp.ipv6_address
    if not text:
        return None
    try:
        address = ipaddress.ip_interface(text).ip
    except ValueError:
        return None
    return address if address.version == family else None


def _protocol_suffix(address: Address) -> str:
    return str(address).replace(".", "_").replace(":", "_")


def parse_duration_seconds(text: str, where: str) -> int:
    """A Go duration ("120s", "2m", "1m30s") or plain seconds, as whole seconds >= 1."""
    stripped = text.strip()
    if stripped.isdigit():
        seconds = float(stripped)
    else:
        pos, seconds = 0, 0.0
        for match in _DURATION_PART.finditer(stripped):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
            pos = match.end()
        if pos != len(stripped) or not stripped:
            raise ConfdError(f"{where}: {text!r} is not a duration such as '120s' or '2m'")
    if seconds < 1 or seconds != int(seconds):
        raise ConfdError(f"{where}: {text!r} must be a whole number of seconds, at least 1")
    return int(seconds)


def _bird_string(value: str, where: str) -> str:
    if any(ch in value for ch in '"\\\n\r') or not value.isprintable():
        raise ConfdError(f"{where}: contains a quote, backslash or control character, which "
                         "BIRD strings cannot hold")
    return value


def _community_literal(value: str, where: str) -> tuple[bool, str]:
    """("aa:nn" -> (False, "(aa, nn)")) or ("aa:nn:mm" -> (True, "(aa, nn, mm)"))."""
    parts = value.strip().split(":")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise ConfdError(f"{where}: {value!r} is not a community 'aa:nn' or 'aa:nn:mm'")
    numbers = [int(p) for p in parts]
    limit = 0xFFFF if len(parts) == 2 else 0xFFFFFFFF
    if any(n > limit for n in numbers):
        raise ConfdError(f"{where}: {value!r} has a part above {limit}")
    return len(parts) == 3, "(" + ", ".join(str(n) for n in numbers) + ")"


def _inside(text: str, networks: list[Network]) -> bool:
    address = ipaddress.ip_address(text)
    return any(address in net for net in networks)


def _cidrs(cidrs: Iterable[str], family: int) -> list[Network]:
    """The CIDRs of one IP family."""
    out = []
    for cidr in cidrs:
        net = ipaddress.ip_network(cidr, strict=False)
        if net.version == family:
            out.append(net)
    return out


# --------------------------------------------------------------------------------------------
# The computation


@dataclass(frozen=True)
class _Target:
    address: Address
    port: int
    as_number: int
    node: Node | None  # the Node with that address, if any
    label: str  # for the session's comment


class _Computation:
    """Holds the inputs and the notes while `compute_bird_config` builds the parts."""

    def __init__(self, state: BGPState, hostname: str, interface_prefix: str,
                 family: int = 4) -> None:
        self.state = state
        self.secret_namespace = state.secret_namespace
        self.hostname = hostname
        self.family = family
        self.host_bits = 32 if family == 4 else 128
        self.notes: list[str] = []
        if not _INTERFACE_PREFIX.fullmatch(interface_prefix):
            raise ConfdError(f"interface prefix {interface_prefix!r}: expected 1-14 letters, "
                             "digits, '.', '_' or '-'")
        self.interface_prefix = interface_prefix
        self.global_config = state.bgp_configurations.get(GLOBAL_CONFIG_NAME) or BGPConfiguration(
            ResourceKey("BGPConfiguration", "", GLOBAL_CONFIG_NAME), Metadata(GLOBAL_CONFIG_NAME))
        self.node = self._our_node()
        address = _address_of_node(self.node, family)
        assert address is not None
        self.address = address
        self.default_as = self.global_config.as_number or DEFAULT_AS_NUMBER
        self.as_number = self._as_of(self.node)
        self.listen_port = self.global_config.listen_port
        self.cluster_id = self._cluster_id()
        self.strict_bind = self.global_config.bind_mode == "NodeIP"
        self.peer_routes: list[PeerRoute] = []
        self.nodes_by_address: dict[Address, Node] = {}
        for node in sorted(state.nodes.values(), key=lambda n: n.key.name):
            node_address = _address_of_node(node, family)
            if node_address is not None:
                self.nodes_by_address.setdefault(node_address, node)

    def note(self, text: str) -> None:
        self.notes.append(" ".join(text.split()))

    def _our_node(self) -> Node:
        node = self.state.nodes.get(self.hostname)
        if node is None:
            raise ConfdError(f"Node({self.hostname}): not in the datastore; confd needs this "
                             "node's spec.bgp.ipv4Address")
        field = _address_field(self.family)
        text = (node.bgp.ipv4_address if self.family == 4 else node.bgp.ipv6_address
                ) if node.bgp else ""
        if not text:
            purpose = ("BGP (router id and session source address)" if self.family == 4
                       else "IPv6 BGP")
            raise ConfdError(f"Node({self.hostname}): {field}: required to run {purpose}")
        if _address_of_node(node, self.family) is None:
            raise ConfdError(f"Node({self.hostname}): {field}: "
                             f"{text!r} is not an IPv{self.family} address")
        return node

    def _cluster_id(self) -> str:
        text = self.node.bgp.route_reflector_cluster_id if self.node.bgp else ""
        if not text:
            return ""
        try:
            return str(ipaddress.IPv4Address(text))
        except ValueError:
            self.note(f"Node({self.hostname}): spec.bgp.routeReflectorClusterID: {text!r} is "
                      "not an IPv4-style cluster id; this node is not a route reflector")
            return ""

    def _as_of(self, node: Node) -> int:
        if node.bgp is not None and node.bgp.as_number is not None:
            return node.bgp.as_number
        return self.default_as

    # -- logging --

    def log_settings(self) -> LogSettings:
        severity = self.global_config.log_severity_screen or "Info"
        level = _LOG_LEVELS.get(severity.lower())
        if level is None:
            self.note(f"BGPConfiguration({GLOBAL_CONFIG_NAME}): spec.logSeverityScreen: "
                      f"unknown severity {severity!r}; using Info")
            level = _LOG_LEVELS["info"]
        return LogSettings(*level)

    # -- pools, blocks, services --

    def pool_rules(self) -> list[PrefixRule]:
        """Accept/reject per pool of this family, most specific first (rejects first on
        equal CIDRs)."""
        rules: dict[str, PrefixRule] = {}
        for pool in sorted(self.state.pools.values(), key=lambda p: p.key.name):
            net = ipaddress.ip_network(pool.cidr)
            if net.version != self.family:
                continue
            rule = self._pool_rule(pool)
            previous = rules.get(rule.cidr)
            if previous is None or (previous.accept and not rule.accept):
                rules[rule.cidr] = rule
        return sorted(rules.values(), key=lambda r: (-ipaddress.ip_network(r.cidr).prefixlen,
                                                     ipaddress.ip_network(r.cidr)))

    def _pool_rule(self, pool: IPPool) -> PrefixRule:
        name = pool.key.name
        if pool.disabled:
            return PrefixRule(pool.cidr, False, False, f"IPPool {name} is disabled")
        if pool.disable_bgp_export:
            return PrefixRule(pool.cidr, False, False, f"IPPool {name} has disableBGPExport")
        if pool.vxlan_mode != "Never":
            return PrefixRule(pool.cidr, False, False,
                              f"IPPool {name} uses VXLAN: Felix programs its routes")
        return PrefixRule(pool.cidr, False, True, f"IPPool {name}")

    def vxlan_rules(self) -> list[PrefixRule]:
        """VXLAN and IPIP pools: the agent programs their routes (through its tunnel
        device), so BIRD must not program them too."""
        rules: dict[str, PrefixRule] = {}
        for pool in sorted(self.state.pools.values(), key=lambda p: p.key.name):
            if not _cidrs([pool.cidr], self.family):
                continue
            mode = ("VXLAN" if pool.vxlan_mode != "Never" else
                    "IPIP" if pool.ipip_mode != "Never" else "")
            if mode:
                rules.setdefault(pool.cidr, PrefixRule(pool.cidr, False, False,
                                                       f"IPPool {pool.key.name} uses {mode}"))
        return sorted(rules.values(), key=lambda r: ipaddress.ip_network(r.cidr))

    @staticmethod
    def deciding_rule(net: Network,
                      pool_rules: list[PrefixRule]) -> PrefixRule | None:
        for rule in pool_rules:
            if net.subnet_of(ipaddress.ip_network(rule.cidr)):  # type: ignore[arg-type]
                return rule
        return None

    def local_blocks(self, pool_rules: list[PrefixRule]) -> list[Network]:
        blocks: set[Network] = set()
        for affinity in sorted(self.state.block_affinities.values(), key=lambda a: a.key.name):
            if affinity.node != self.hostname or affinity.deleted:
                continue
            where = f"BlockAffinity({affinity.key.name})"
            net = ipaddress.ip_network(affinity.cidr)
            if net.version != self.family:
                continue
            if affinity.state != "confirmed":
                self.note(f"{where}: block {affinity.cidr} is {affinity.state!r}, not "
                          "confirmed: not exported")
                continue
            rule = self.deciding_rule(net, pool_rules)
            if rule is None or not rule.accept:
                why = (f"in no IPv{self.family} pool" if rule is None
                       else f"excluded: {rule.reason}")
                self.note(f"{where}: block {affinity.cidr} is {why}: not exported")
                continue
            blocks.add(net)
        # a block inside another local block adds nothing
        return sorted(b for b in blocks
                      if not any(b != o and b.subnet_of(o) for o in blocks))

    def service_cidrs(self) -> list[Network]:
        config = self.global_config
        cidrs = (*config.service_cluster_ips, *config.service_external_ips,
                 *config.service_load_balancer_ips)
        return sorted(set(_cidrs(cidrs, self.family)))  # type: ignore[type-var]

    def local_service_routes(self) -> list[ServiceRoute]:
        """/32s (/128s) of the externalTrafficPolicy Local services that have a ready
        endpoint on this node (as Calico's confd route generator): the cluster IPs when
        serviceClusterIPs is set, external IPs inside serviceExternalIPs, load balancer IPs
        inside serviceLoadBalancerIPs. Other nodes advertise the ranges only, so the peers
        send a Local service's traffic to a node that has an endpoint for it; when the last
        local endpoint goes (or turns not ready) the /32 is withdrawn."""
        config = self.global_config
        cluster_ips = bool(config.service_cluster_ips)  # Calico: set or not, no range check
        external = _cidrs(config.service_external_ips, self.family)
        load_balancer = _cidrs(config.service_load_balancer_ips, self.family)
        if not (cluster_ips or external or load_balancer):
            return []
        routes: dict[str, ServiceRoute] = {}
        for key in sorted(self._services_with_local_endpoints()):
            service = self.state.services[key]
            candidates = [
                *(("cluster IP", ip) for ip in (service.cluster_ips if cluster_ips else ())),
                *(("external IP", ip) for ip in service.external_ips
                  if _inside(ip, external)),
                *(("load balancer IP", ip) for ip in service.load_balancer_ips
                  if _inside(ip, load_balancer)),
            ]
            for what, text in candidates:
                address = ipaddress.ip_address(text)
                if address.version == self.family:
                    cidr = f"{address}/{self.host_bits}"
                    routes.setdefault(cidr, ServiceRoute(cidr, f"Service({key}) {what}"))
        return sorted(routes.values(), key=lambda r: ipaddress.ip_network(r.cidr))

    def _services_with_local_endpoints(self) -> set[str]:
        """Keys ("ns/name") of Local services with a ready endpoint on this node."""
        out: set[str] = set()
        for endpoint_slice in self.state.endpoint_slices.values():
            key = f"{endpoint_slice.key.namespace}/{endpoint_slice.service_name}"
            service = self.state.services.get(key)
            if (service is None or not service.external_traffic_local
                    or service.type == "ExternalName" or not service.cluster_ips):
                continue
            if any(e.ready and e.node_name == self.hostname for e in endpoint_slice.endpoints):
                out.add(key)
        return out

    def community_tagging(self) -> list[CommunityTagging]:
        config = self.global_config
        where = f"BGPConfiguration({GLOBAL_CONFIG_NAME})"
        named: dict[str, str] = {}
        for i, community in enumerate(config.communities):
            try:
                _community_literal(community.value, f"{where}: spec.communities[{i}].value")
                named[community.name] = community.value
            except ConfdError as exc:
                self.note(f"{exc}; community {community.name!r} skipped")
        out = []
        for i, advert in enumerate(config.prefix_advertisements):
            standard: list[str] = []
            large: list[str] = []
            try:
                for j, ref in enumerate(advert.communities):
                    field = f"{where}: spec.prefixAdvertisements[{i}].communities[{j}]"
                    if ref not in named and ":" not in ref:
                        raise ConfdError(f"{field}: {ref!r} is neither a community in "
                                         "spec.communities nor a literal value")
                    is_large, literal = _community_literal(named.get(ref, ref), field)
                    (large if is_large else standard).append(literal)
            except ConfdError as exc:
                self.note(f"{exc}; prefix advertisement {advert.cidr} skipped")
                continue
            if not _cidrs([advert.cidr], self.family):
                continue
            out.append(CommunityTagging(advert.cidr, tuple(standard), tuple(large)))
        return out

    # -- sessions --

    def sessions(self) -> list[BGPSession]:
        node_specific: list[BGPSession] = []
        global_peers: list[BGPSession] = []
        for peer in sorted(self.state.peers.values(), key=lambda p: p.key.name):
            scope = "Node" if peer.node or peer.node_selector else "Global"
            target = node_specific if scope == "Node" else global_peers
            target.extend(self._peer_sessions(peer, scope))
        mesh = self._mesh_sessions() if self.global_config.node_to_node_mesh_enabled else []
        chosen: dict[str, BGPSession] = {}
        for session in (*node_specific, *global_peers, *mesh):
            kept = chosen.get(session.neighbor_ip)
            if kept is None:
                chosen[session.neighbor_ip] = session
            elif kept.source != session.source:
                self.note(f"{session.comment}: neighbor {session.neighbor_ip} already has "
                          f"session {kept.protocol_name}; skipped")
        return list(chosen.values())

    def _applies_to(self, peer: BGPPeer, node: Node) -> bool:
        """Is `node` one of the nodes this BGPPeer configures (its `node`/`nodeSelector`)?"""
        if peer.node:
            return peer.node == node.key.name
        if peer.node_selector:
            return self._selector(peer.node_selector).evaluate(node.meta.labels_dict)
        return True  # a global peer

    def _selector(self, text: str) -> Any:
        from pyfelix.agent import selector

        return selector.parse(text)

    def _peer_sessions(self, peer: BGPPeer, scope: str) -> list[BGPSession]:
        where = f"BGPPeer({peer.key.name})"
        targets = self._peer_targets(peer, where)
        if not targets:
            return []
        try:
            import_functions, export_functions = self._peer_filters(peer, where)
            password = self._peer_password(peer.password, peer.password_secret,
                                           f"{where}: spec.password")
            restart = (parse_duration_seconds(peer.max_restart_time,
                                              f"{where}: spec.maxRestartTime")
                       if peer.max_restart_time else None)
            if restart is not None and restart > MAX_GRACEFUL_RESTART_TIME:
                raise ConfdError(f"{where}: spec.maxRestartTime: {restart} s is above the "
                                 f"protocol's limit of {MAX_GRACEFUL_RESTART_TIME} s")
            keepalive = (parse_duration_seconds(peer.keepalive_time,
                                                f"{where}: spec.keepaliveTime")
                         if peer.keepalive_time else None)
            if keepalive is not None and keepalive > 21845:
                raise ConfdError(f"{where}: spec.keepaliveTime: {keepalive} s is above 21845 s "
                                 "(the hold time, three keepalives, must fit in 65535 s)")
        except ConfdError as exc:
            if "spec.password" in str(exc):
                self.note(f"{exc}; peer not rendered (no session without its password)")
            elif "spec.filters" in str(exc):
                self.note(f"{exc}; peer not rendered (its routes would pass unfiltered)")
            else:
                self.note(f"{exc}; peer skipped")
            return []
        hold = keepalive * 3 if keepalive and keepalive * 3 > DEFAULT_HOLD_TIME else None
        local_ip: str | None = str(self.address)
        if peer.source_address == "None":
            if self.strict_bind:
                self.note(f"{where}: spec.sourceAddress None ignored: bindMode NodeIP binds "
                          "every session to the node address")
            else:
                local_ip = None
        if (peer.reachable_by and peer.peer_ip
                and ipaddress.ip_address(peer.peer_ip).version == self.family):
            self.peer_routes.append(PeerRoute(f"{peer.peer_ip}/{self.host_bits}",
                                              peer.reachable_by, where))
        sessions = []
        for target in targets:
            sessions.append(BGPSession(
                protocol_name=f"{scope}_{_protocol_suffix(target.address)}",
                comment=f"{where}{target.label}",
                source=where,
                neighbor_ip=str(target.address),
                neighbor_port=target.port if target.port != DEFAULT_BGP_PORT else None,
                neighbor_as=target.as_number,
                local_ip=local_ip,
                local_port=self._local_port(),
                local_as=self.as_number,
                password=password,
                next_hop_keep=peer.keep_original_next_hop,
                rr_cluster_id=self._rr_client_cluster(target.as_number, target.node),
                graceful_restart_time=restart,
                keepalive_time=keepalive,
                hold_time=hold,
                ttl_security_hops=peer.ttl_security or None,
                strict_bind=self.strict_bind,
                import_functions=import_functions,
                export_functions=export_functions,
            ))
        return sessions

    # -- BGPFilter --

    def _filter_rules(self, bgp_filter: BGPFilter, direction: str) -> tuple[BGPFilterRule, ...]:
        attribute = f"{direction}_v{self.family}"
        return getattr(bgp_filter, attribute)  # type: ignore[no-any-return]

    def _function_name(self, name: str, direction: str) -> str:
        # a quoted symbol: BGPFilter names (DNS subdomains) may hold '-' and '.'
        return f"'pyfelix_bgpfilter_{name}_{direction}{self.family}'"

    def _peer_filters(self, peer: BGPPeer, where: str
                      ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The filter functions of a peer's sessions of this family, in spec.filters order.
        A filter that is missing (or invalid) is a ConfdError: the peer is not rendered."""
        imports: list[str] = []
        exports: list[str] = []
        for i, name in enumerate(peer.filters):
            bgp_filter = self.state.filters.get(name)
            if bgp_filter is None:
                raise ConfdError(f"{where}: spec.filters[{i}]: BGPFilter {name!r} not found "
                                 "(or invalid)")
            for direction, out in (("import", imports), ("export", exports)):
                function = self._function_name(name, direction)
                if self._filter_rules(bgp_filter, direction) and function not in out:
                    out.append(function)
        return tuple(imports), tuple(exports)

    def filter_functions(self) -> list[FilterFunction]:
        """One function per valid BGPFilter and direction with rules of this family."""
        out = []
        for name in sorted(self.state.filters):
            bgp_filter = self.state.filters[name]
            for direction in ("import", "export"):
                rules = self._filter_rules(bgp_filter, direction)
                if rules:
                    out.append(FilterFunction(
                        self._function_name(name, direction),
                        f"BGPFilter({name}): {direction}V{self.family}",
                        tuple(_filter_statement(rule) for rule in rules)))
        return out

    def _peer_targets(self, peer: BGPPeer, where: str) -> list[_Target]:
        """The neighbors this BGPPeer gives this node (never this node itself).

        peerIP: that address, if the peer applies to us. peerSelector: the other matching
        Nodes if the peer applies to us; and, as in Calico, the peering is symmetric: if WE
        match the peerSelector, every other node the peer applies to is our neighbor too.
        """
        if peer.peer_ip:
            if not self._applies_to(peer, self.node):
                return []
            address = ipaddress.ip_address(peer.peer_ip)
            if address.version != self.family:
                return []  # the other family's sessions
            if address == self.address:
                return []
            assert peer.as_number is not None  # the model requires asNumber with peerIP
            return [_Target(address, peer.port or DEFAULT_BGP_PORT, peer.as_number,
                            self.nodes_by_address.get(address), "")]
        chosen = self._selector(peer.peer_selector)
        forward = self._applies_to(peer, self.node)
        reverse = chosen.evaluate(self.node.meta.labels_dict)
        targets: dict[Address, _Target] = {}
        for node in sorted(self.state.nodes.values(), key=lambda n: n.key.name):
            if node.key.name == self.hostname:
                continue
            selected = forward and chosen.evaluate(node.meta.labels_dict)
            if not selected and not (reverse and self._applies_to(peer, node)):
                continue
            address = _address_of_node(node, self.family)
            if address is None:
                if selected and self.family == 4:
                    self.note(f"{where}: selected Node({node.key.name}) has no IPv4 "
                              "spec.bgp.ipv4Address; skipped")
                continue
            if address != self.address:
                targets.setdefault(address, _Target(address, self.listen_port,
                                                    self._as_of(node), node,
                                                    f" -> Node({node.key.name})"))
        return sorted(targets.values(), key=lambda t: t.address)  # type: ignore[arg-type,return-value]

    def _peer_password(self, value: str, ref: SecretKeyRef | None,
                       where: str) -> str | None:
        """The session's password: inline, or key `ref.key` of Secret `ref.name` in the
        secret namespace. ConfdError (naming the field and the Secret, never a value) when
        it cannot be had: the caller then renders no session at all, never one without
        (`optional: true` does not relax this: a peer is never rendered unauthenticated
        because its Secret went missing)."""
        if ref is not None:
            where = f"{where}.secretKeyRef: Secret {self.secret_namespace}/{ref.name}"
            secret = self.state.secrets.get(ref.name)
            if secret is None:
                raise ConfdError(f"{where} not found (or invalid)")
            from_secret = secret.value(ref.key)
            if from_secret is None:
                raise ConfdError(f"{where} has no key {ref.key!r}")
            if not from_secret:
                raise ConfdError(f"{where} key {ref.key}: the value is empty")
            value, where = from_secret, f"{where} key {ref.key}"
        if not value:
            return None
        if len(value.encode()) > MAX_PASSWORD_BYTES:
            raise ConfdError(f"{where}: the password is longer than {MAX_PASSWORD_BYTES} bytes "
                             "(the kernel's TCP MD5 key limit)")
        return _bird_string(value, where)

    def _rr_client_cluster(self, neighbor_as: int, target_node: Node | None) -> str | None:
        if not self.cluster_id or neighbor_as != self.as_number:
            return None
        target_cluster = (target_node.bgp.route_reflector_cluster_id
                          if target_node is not None and target_node.bgp else "")
        return None if target_cluster == self.cluster_id else self.cluster_id

    def _local_port(self) -> int | None:
        return self.listen_port if self.listen_port != DEFAULT_BGP_PORT else None

    def _mesh_sessions(self) -> list[BGPSession]:
        where = f"BGPConfiguration({GLOBAL_CONFIG_NAME})"
        try:
            password = self._peer_password(self.global_config.node_mesh_password,
                                           self.global_config.node_mesh_password_secret,
                                           f"{where}: spec.nodeMeshPassword")
            restart = (parse_duration_seconds(self.global_config.node_mesh_max_restart_time,
                                              f"{where}: spec.nodeMeshMaxRestartTime")
                       if self.global_config.node_mesh_max_restart_time else None)
        except ConfdError as exc:
            self.note(f"{exc}; node-to-node mesh not rendered" + (
                " (no session without its password)" if "nodeMeshPassword" in str(exc) else ""))
            return []
        sessions = []
        for address in sorted(self.nodes_by_address):  # type: ignore[type-var]
            node = self.nodes_by_address[address]
            if node.key.name == self.hostname:
                continue
            if address == self.address:
                self.note(f"Node({node.key.name}): {_address_field(self.family)} {address} "
                          f"is also Node({self.hostname})'s; no mesh session")
                continue
            sessions.append(BGPSession(
                protocol_name=f"Mesh_{_protocol_suffix(address)}",
                comment=f"node-to-node mesh -> Node({node.key.name})",
                source=where,
                neighbor_ip=str(address),
                neighbor_port=self._local_port(),
                neighbor_as=self._as_of(node),
                local_ip=str(self.address),
                local_port=self._local_port(),
                local_as=self.as_number,
                passive=address > self.address,  # type: ignore[operator]  # higher connects
                password=password,
                graceful_restart_time=restart,
                strict_bind=self.strict_bind,
            ))
        return sessions


def compute_bird_config(state: BGPState, hostname: str, *,
                        interface_prefix: str = DEFAULT_INTERFACE_PREFIX,
                        problems: Mapping[ResourceKey, str] | None = None) -> BirdConfig:
    """This node's BIRD configuration from the BGP state (see the module docstring).

    `problems`: resources that failed validation (from `BGPView.problems()`), noted in the
    output; if one of them is the global BGPConfiguration or this node's Node, raises
    ConfdError instead (their defaults are no safe stand-in).
    """
    problems = problems or {}
    for key in (ResourceKey("BGPConfiguration", "", GLOBAL_CONFIG_NAME),
                ResourceKey("Node", "", hostname)):
        if key in problems:
            raise ConfdError(f"{problems[key]}; not rendering without it")
    comp = _Computation(state, hostname, interface_prefix)
    for message in problems.values():
        comp.note(f"invalid, left out: {message}")
    log = comp.log_settings()
    families = [_family_config(comp)]
    notes = comp.notes
    node = comp.node
    if _address_of_node(node, 6) is not None:
        comp6 = _Computation(state, hostname, interface_prefix, family=6)
        families.append(_family_config(comp6))
        notes = list(dict.fromkeys(notes + comp6.notes))  # a bad peer is noted once
    else:
        ipv6_items = _ipv6_items(state)
        if node.bgp is not None and node.bgp.ipv6_address:
            notes.append(f"Node({hostname}): spec.bgp.ipv6Address: "
                         f"{node.bgp.ipv6_address!r} is not an IPv6 address; IPv6 not rendered")
        elif ipv6_items:
            notes.append(f"Node({hostname}) has no spec.bgp.ipv6Address: IPv6 not rendered "
                         f"({', '.join(ipv6_items)})")
    return BirdConfig(
        hostname=hostname,
        router_id=str(comp.address),
        as_number=comp.as_number,
        log=log,
        workload_interface_pattern=f"{comp.interface_prefix}*",
        families=tuple(families),
        notes=tuple(notes),
    )


def _family_config(comp: _Computation) -> FamilyConfig:
    pool_rules = comp.pool_rules()
    blocks = comp.local_blocks(pool_rules)
    export_rules: list[PrefixRule] = []
    for block in blocks:
        export_rules.append(PrefixRule(str(block), True, True, "local IPAM block"))
        export_rules.append(PrefixRule(str(block), False, False,
                                       "covered by the local block"))
    export_rules.extend(pool_rules)
    sessions = comp.sessions()
    return FamilyConfig(
        version=comp.family,
        kernel_import=tuple(pool_rules),
        kernel_export_rejects=tuple(comp.vxlan_rules()),
        local_blocks=tuple(str(b) for b in blocks),
        service_cidrs=tuple(str(c) for c in comp.service_cidrs()),
        community_tagging=tuple(comp.community_tagging()),
        export_rules=tuple(export_rules),
        sessions=tuple(sessions),
        peer_routes=tuple(sorted(set(comp.peer_routes), key=lambda r: (r.cidr, r.gateway))),
        filter_functions=tuple(comp.filter_functions()),
        service_routes=tuple(comp.local_service_routes()),
    )


_MATCH_OPERATORS = {"Equal": "=", "NotEqual": "!=", "In": "~", "NotIn": "!~"}


def _filter_statement(rule: BGPFilterRule) -> str:
    """One BGPFilter rule as a BIRD statement (every match given must hold)."""
    conditions = []
    if rule.cidr:
        operator = _MATCH_OPERATORS[rule.match_operator]
        if rule.prefix_length is not None:  # In / NotIn only (the model checks)
            low, high = rule.prefix_length
            conditions.append(f"net {operator} [ {rule.cidr}{{{low},{high}}} ]")
        else:
            conditions.append(f"net {operator} {rule.cidr}")
    if rule.source == "RemotePeers":
        conditions.append("source = RTS_BGP")
    if rule.interface:
        conditions.append(f'ifname ~ "{rule.interface}"')
    action = "accept" if rule.action == "Accept" else "reject"
    if not conditions:
        return f"{action};"
    return f"if ( {' && '.join(f'({c})' for c in conditions)} ) then {action};"


def _ipv6_items(state: BGPState) -> list[str]:
    """The IPv6 configuration that needs this node's ipv6Address to be rendered."""
    pools = sorted(state.pools.values(), key=lambda p: p.key.name)
    items = [f"IPPool {p.key.name}" for p in pools if ipaddress.ip_network(p.cidr).version == 6]
    config = state.bgp_configurations.get(GLOBAL_CONFIG_NAME)
    if config is not None:
        services = _cidrs((*config.service_cluster_ips, *config.service_external_ips,
                           *config.service_load_balancer_ips), 6)
        items += [f"service CIDR {cidr}" for cidr in sorted(set(services))]  # type: ignore[type-var]
    peers = sorted(state.peers.values(), key=lambda p: p.key.name)
    items += [f"BGPPeer {p.key.name}" for p in peers
              if p.peer_ip and ipaddress.ip_address(p.peer_ip).version == 6]
    return items
