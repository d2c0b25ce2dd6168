"""Networking and agent-configuration resources: IPPool, Node, BGPConfiguration, BGPPeer,
FelixConfiguration, BlockAffinity - typed and validated as Calico validates them.

Inputs: a document's `spec` (or, for a Kubernetes v1 Node, the whole document) as `Fields`.
Outputs: frozen dataclasses, or `ValidationError` naming resource and field.

Defaults and rules (Calico's): IPPool blockSize 26 (IPv4) / 122 (IPv6), strictly masked
CIDR, no link-local overlap, not IPIP and VXLAN at once, no IPIP on IPv6; AS numbers 1 to
4294967295 or dotted "high.low"; BGPPeer needs peerIP (with asNumber) or peerSelector
(without); communities "aa:nn" or "aa:nn:mm". A Kubernetes Node gets its addresses from
status (InternalIP/ExternalIP), pod CIDRs from spec and BGP settings from Calico's
`projectcalico.org/IPv4Address`-style annotations. FelixConfiguration stays free-form
(setting name -> string) for `agent.config` to interpret.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any

from pyfelix.agent.model.base import (
    Metadata,
    Resource,
    ip_address_field,
    net_list,
    node_name,
    optional_ip,
)
from pyfelix.agent.model.fields import Fields
from pyfelix.agent.model.names import is_decimal
from pyfelix.agent.model.rules import parse_net, parse_selector
from pyfelix.agent.syncer.api import ResourceKey

_MAX_AS_NUMBER = 4294967295
# Used with fullmatch only (`$` would accept a trailing newline); ASCII digits only.
_STANDARD_COMMUNITY_RE = re.compile(r"([0-9]+):([0-9]+)")
_LARGE_COMMUNITY_RE = re.compile(r"([0-9]+):([0-9]+):([0-9]+)")
_DURATION_RE = re.compile(r"([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+")
_FELIX_SETTING_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_SECRET_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SECRET_KEY_RE = re.compile(r"[-._a-zA-Z0-9]{1,253}")


@dataclass(frozen=True, slots=True)
class IPPool(Resource):
    cidr: str = ""
    block_size: int = 26
    ipip_mode: str = "Never"
    vxlan_mode: str = "Never"
    nat_outgoing: bool = False
    disabled: bool = False
    disable_bgp_export: bool = False
    node_selector: str = "all()"
    allowed_uses: tuple[str, ...] = ("Workload", "Tunnel")
    assignment_mode: str = "Automatic"


@dataclass(frozen=True, slots=True)
class NodeBGP:
    ipv4_address: str = ""  # as written: address/prefix, e.g. "198.18.0.1/15"
    ipv6_address: str = ""
    as_number: int | None = None
    route_reflector_cluster_id: str = ""
    ipv4_ipip_tunnel_addr: str = ""


@dataclass(frozen=True, slots=True)
class Node(Resource):
    """Calico Node (projectcalico.org/v3) or a Kubernetes v1 Node.

    A Kubernetes Node gets `addresses` from status (InternalIP/ExternalIP), `pod_cidrs` from
    spec, and `bgp` from Calico's `projectcalico.org/IPv4Address`-style annotations.
    """

    bgp: NodeBGP | None = None
    addresses: tuple[str, ...] = ()
    ipv4_vxlan_tunnel_addr: str = ""
    pod_cidrs: tuple[str, ...] = ()
    ipv6_vxlan_tunnel_addr: str = ""
    vxlan_tunnel_mac_addr: str = ""  # lower case; "" = derived (calc/vxlan_resolver.py)
    vxlan_tunnel_mac_addr_v6: str = ""


@dataclass(frozen=True, slots=True)
class Community:
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class PrefixAdvertisement:
    cidr: str
    communities: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SecretKeyRef:
    """`password.secretKeyRef`: key `key` of the Secret `name` in the namespace Calico's node
    runs in (agent.kinds.secret_namespace); confd resolves it."""

    name: str
    key: str
    optional: bool = False

    def __str__(self) -> str:
        return f"{self.name}/{self.key}"


@dataclass(frozen=True, slots=True)
class BGPConfiguration(Resource):
    as_number: int | None = None
    node_to_node_mesh_enabled: bool = True
    listen_port: int = 179
    log_severity_screen: str = "Info"
    service_cluster_ips: tuple[str, ...] = ()
    service_external_ips: tuple[str, ...] = ()
    service_load_balancer_ips: tuple[str, ...] = ()
    communities: tuple[Community, ...] = ()
    prefix_advertisements: tuple[PrefixAdvertisement, ...] = ()
    node_mesh_password: str = field(default="", repr=False)  # inline `value` (pyfelix's)
    node_mesh_password_secret: SecretKeyRef | None = None
    node_mesh_max_restart_time: str = ""
    bind_mode: str = "None"


@dataclass(frozen=True, slots=True)
class BGPPeer(Resource):
    node: str = ""
    peer_ip: str = ""
    as_number: int | None = None
    node_selector: str = ""
    peer_selector: str = ""
    password: str = field(default="", repr=False)  # inline `value` (pyfelix's extension)
    password_secret: SecretKeyRef | None = None  # Calico's `secretKeyRef`
    filters: tuple[str, ...] = ()  # BGPFilter names, applied in this order
    keep_original_next_hop: bool = False
    source_address: str = "UseNodeIP"
    max_restart_time: str = ""
    keepalive_time: str = ""
    port: int | None = None
    ttl_security: int = 0
    reachable_by: str = ""


@dataclass(frozen=True, slots=True)
class FelixConfiguration(Resource):
    """Free-form Felix settings (spec keys as Calico spells them) -> string values."""

    settings: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterInformation(Resource):
    """Calico's cluster-wide facts; `datastore_ready` False asks every Felix to leave the
    dataplane as it is (datastore being upgraded or restored). None: not stated (ready)."""

    datastore_ready: bool | None = None
    cluster_guid: str = ""
    cluster_type: str = ""
    calico_version: str = ""


@dataclass(frozen=True, slots=True)
class BlockAffinity(Resource):
    node: str = ""
    cidr: str = ""
    state: str = "confirmed"
    deleted: bool = False


def _as_number(fields: Fields, key: str) -> int | None:
    """An AS number: 1..4294967295, or Calico's dotted "high.low" notation."""
    raw = fields.raw(key)
    if isinstance(raw, float):
        fields.fail(key, f"invalid AS number {raw!r} (quote dotted notation: \"{raw}\")")
    if isinstance(raw, str) and "." in raw:
        high, _, low = raw.partition(".")
        if is_decimal(high) and is_decimal(low) and len(high) <= 5 and len(low) <= 5:
            h, lo = int(high), int(low)
            if h <= 65535 and lo <= 65535 and (h or lo):
                return h * 65536 + lo
        fields.fail(key, f"invalid AS number {raw[:40]!r}")
    return fields.int(key, lo=1, hi=_MAX_AS_NUMBER)


def _duration(fields: Fields, key: str) -> str:
    text = fields.str(key)
    if text and not _DURATION_RE.fullmatch(text):
        fields.fail(key, f"{text[:40]!r} is not a duration such as '120s' or '2m'")
    return text


IP_POOL_FIELDS = frozenset({"cidr", "blockSize", "ipipMode", "vxlanMode", "natOutgoing",
                            "disabled", "disableBGPExport", "nodeSelector", "allowedUses",
                            "assignmentMode"})
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))


def parse_ip_pool(spec: Fields, key: ResourceKey, meta: Metadata) -> IPPool:
    spec.only(IP_POOL_FIELDS)
    text = spec.str("cidr", required=True)
    cidr = parse_net(text, spec, "cidr")
    network = ipaddress.ip_network(cidr)
    try:
        ipaddress.ip_network(text.strip(), strict=True)
    except ValueError:
        spec.fail("cidr", f"{text[:60]!r} is not strictly masked (did you mean {cidr}?)")
    if any(network.version == ll.version and network.overlaps(ll) for ll in _LINK_LOCAL):
        spec.fail("cidr", f"{cidr} overlaps the link-local range")
    v4 = network.version == 4
    block_size = spec.int("blockSize", 26 if v4 else 122, lo=20 if v4 else 116,
                          hi=32 if v4 else 128)
    assert block_size is not None
    modes = ("Never", "Always", "CrossSubnet")
    uses = spec.str_list("allowedUses") or ("Workload", "Tunnel")
    for i, use in enumerate(uses):
        if use not in ("Workload", "Tunnel", "LoadBalancer"):
            spec.fail(f"allowedUses[{i}]", f"unknown use {use[:40]!r}")
    pool = IPPool(key, meta, cidr=cidr, block_size=block_size,
                  ipip_mode=spec.one_of("ipipMode", modes, "Never"),
                  vxlan_mode=spec.one_of("vxlanMode", modes, "Never"),
                  nat_outgoing=spec.bool("natOutgoing"), disabled=spec.bool("disabled"),
                  disable_bgp_export=spec.bool("disableBGPExport"),
                  node_selector=parse_selector(spec.str("nodeSelector", "all()") or "all()",
                                               spec, "nodeSelector"),
                  allowed_uses=tuple(uses),
                  assignment_mode=spec.one_of("assignmentMode", ("Automatic", "Manual"),
                                              "Automatic"))
    if pool.ipip_mode != "Never" and pool.vxlan_mode != "Never":
        spec.fail("vxlanMode", "ipipMode and vxlanMode cannot both be enabled")
    if not v4 and pool.ipip_mode != "Never":
        spec.fail("ipipMode", "IPIP is not supported on an IPv6 pool")
    if not pool.disabled and network.prefixlen > block_size:
        spec.fail("cidr", f"pool /{network.prefixlen} is smaller than its block size "
                  f"/{block_size}")
    return pool


NODE_FIELDS = frozenset({"bgp", "ipv4VXLANTunnelAddr", "ipv6VXLANTunnelAddr",
                         "vxlanTunnelMACAddr", "vxlanTunnelMACAddrV6", "orchRefs", "wireguard",
                         "addresses"})
NODE_BGP_FIELDS = frozenset({"ipv4Address", "ipv6Address", "asNumber",
                             "routeReflectorClusterID", "ipv4IPIPTunnelAddr"})


def _interface_address(fields: Fields, key: str, version: int) -> str:
    """An address with prefix length as Calico writes node addresses ("198.18.0.1/15")."""
    text = fields.str(key)
    if not text:
        return ""
    try:
        iface = ipaddress.ip_interface(text.strip())
    except ValueError:
        fields.fail(key, f"{text[:60]!r} is not an IP address or address/prefix")
    if iface.version != version:
        fields.fail(key, f"{text[:60]!r} is not an IPv{version} address")
    return text.strip()


def parse_node_bgp(b: Fields) -> NodeBGP:
    # routeReflectorClusterID is an IPv4-address-shaped ID; kept normalised (it is written
    # into bird.conf, so never as given: "1.2.3.4\n" would pass a stripped check)
    return NodeBGP(_interface_address(b, "ipv4Address", 4),
                   _interface_address(b, "ipv6Address", 6),
                   _as_number(b, "asNumber"), optional_ip(b, "routeReflectorClusterID"),
                   optional_ip(b, "ipv4IPIPTunnelAddr"))


def node_addresses(items: list[Any], fields: Fields, key: str,
                    skip_types: frozenset[str] = frozenset()) -> tuple[str, ...]:
    out = []
    for i, item in enumerate(items):
        entry = Fields(item, fields.resource, fields.at(f"{key}[{i}]"))
        if entry.str("type") in skip_types:
            continue
        text = entry.str("address", required=True)
        try:
            out.append(str(ipaddress.ip_interface(text.strip()).ip))
        except ValueError:
            entry.fail("address", f"{text[:60]!r} is not an IP address")
    return tuple(out)


def parse_calico_node(spec: Fields, key: ResourceKey, meta: Metadata) -> Node:
    spec.only(NODE_FIELDS)
    bgp = parse_node_bgp(spec.sub("bgp", allowed=NODE_BGP_FIELDS)) if spec.has("bgp") else None
    if bgp == NodeBGP():
        spec.fail("bgp", "must not be empty")
    return Node(key, meta, bgp=bgp,
                addresses=node_addresses(spec.list("addresses"), spec, "addresses"),
                ipv4_vxlan_tunnel_addr=optional_ip(spec, "ipv4VXLANTunnelAddr"),
                ipv6_vxlan_tunnel_addr=optional_ip(spec, "ipv6VXLANTunnelAddr"),
                vxlan_tunnel_mac_addr=_optional_mac(spec, "vxlanTunnelMACAddr"),
                vxlan_tunnel_mac_addr_v6=_optional_mac(spec, "vxlanTunnelMACAddrV6"))


_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


def _optional_mac(spec: Fields, key: str) -> str:
    """A VTEP MAC as Calico writes it (six colon-separated hex bytes), unicast."""
    text = spec.str(key)
    if not text:
        return ""
    if not _MAC.match(text) or int(text[:2], 16) & 1:
        spec.fail(key, f"{text[:40]!r} is not a unicast MAC address (aa:bb:cc:dd:ee:ff)")
    return text.lower()


# Calico keeps a Kubernetes node's BGP settings in these annotations.
_NODE_ANNOTATIONS = {
    "projectcalico.org/IPv4Address": "ipv4Address",
    "projectcalico.org/IPv6Address": "ipv6Address",
    "projectcalico.org/ASNumber": "asNumber",
    "projectcalico.org/RouteReflectorClusterID": "routeReflectorClusterID",
    "projectcalico.org/IPv4IPIPTunnelAddr": "ipv4IPIPTunnelAddr",
}


def parse_kubernetes_node(top: Fields, key: ResourceKey, meta: Metadata) -> Node:
    annotations = meta.annotations_dict
    bgp_fields = {field: annotations[ann] for ann, field in _NODE_ANNOTATIONS.items()
                  if ann in annotations}
    bgp = None
    if bgp_fields:
        bgp = parse_node_bgp(Fields(bgp_fields, top.resource, "metadata.annotations"))
    spec = top.sub("spec")
    pod_cidrs = net_list(spec, "podCIDRs")
    if not pod_cidrs and spec.str("podCIDR"):
        pod_cidrs = (parse_net(spec.str("podCIDR"), spec, "podCIDR"),)
    status = top.sub("status")
    vxlan = annotations.get("projectcalico.org/IPv4VXLANTunnelAddr", "")
    if vxlan:
        vxlan = ip_address_field(vxlan, top, "metadata.annotations.projectcalico.org/"
                            "IPv4VXLANTunnelAddr")
    return Node(key, meta, bgp=bgp,
                addresses=node_addresses(status.list("addresses"), status, "addresses",
                                          frozenset({"Hostname", "InternalDNS", "ExternalDNS"})),
                ipv4_vxlan_tunnel_addr=vxlan, pod_cidrs=pod_cidrs)


def _community_ok(value: str) -> bool:
    standard = _STANDARD_COMMUNITY_RE.fullmatch(value)
    if standard:
        return all(len(g) <= 5 and int(g) <= 65535 for g in standard.groups())
    large = _LARGE_COMMUNITY_RE.fullmatch(value)
    return bool(large) and all(len(g) <= 10 and int(g) <= _MAX_AS_NUMBER
                               for g in large.groups())


BGP_CONFIGURATION_FIELDS = frozenset({
    "asNumber", "nodeToNodeMeshEnabled", "listenPort", "logSeverityScreen", "serviceClusterIPs",
    "serviceExternalIPs", "serviceLoadBalancerIPs", "communities", "prefixAdvertisements",
    "nodeMeshPassword", "nodeMeshMaxRestartTime", "bindMode", "ignoredInterfaces",
    "localWorkloadPeeringIPV4", "localWorkloadPeeringIPV6", "programClusterRoutes",
})


def parse_bgp_configuration(spec: Fields, key: ResourceKey, meta: Metadata) -> BGPConfiguration:
    spec.only(BGP_CONFIGURATION_FIELDS)

    def cidrs(name: str) -> tuple[str, ...]:
        return tuple(parse_net(i.raw("cidr"), i, "cidr")
                     for i in spec.items(name, allowed={"cidr"}))

    communities = []
    for item in spec.items("communities", allowed={"name", "value"}):
        community = Community(item.str("name", required=True), item.str("value", required=True))
        if not _community_ok(community.value):
            item.fail("value", f"{community.value[:40]!r} is not a community ('aa:nn' or "
                      "'aa:nn:mm')")
        communities.append(community)
    names = {c.name for c in communities}
    adverts = []
    for item in spec.items("prefixAdvertisements", allowed={"cidr", "communities"}):
        advert = PrefixAdvertisement(parse_net(item.str("cidr", required=True), item, "cidr"),
                                     item.str_list("communities"))
        for i, c in enumerate(advert.communities):
            if c not in names and not _community_ok(c):
                item.fail(f"communities[{i}]", f"{c[:40]!r} is neither a defined community "
                          "name nor a community value")
        adverts.append(advert)
    password, password_secret = _password(spec, "nodeMeshPassword")
    config = BGPConfiguration(
        key, meta,
        as_number=_as_number(spec, "asNumber"),
        node_to_node_mesh_enabled=spec.bool("nodeToNodeMeshEnabled", True),
        listen_port=spec.int("listenPort", 179, lo=1, hi=65535) or 179,
        log_severity_screen=spec.one_of(
            "logSeverityScreen", ("Trace", "Debug", "Info", "Warning", "Error", "Fatal"),
            "Info"),
        service_cluster_ips=cidrs("serviceClusterIPs"),
        service_external_ips=cidrs("serviceExternalIPs"),
        service_load_balancer_ips=cidrs("serviceLoadBalancerIPs"),
        communities=tuple(communities),
        prefix_advertisements=tuple(adverts),
        node_mesh_password=password,
        node_mesh_password_secret=password_secret,
        node_mesh_max_restart_time=_duration(spec, "nodeMeshMaxRestartTime"),
        bind_mode=spec.one_of("bindMode", ("None", "NodeIP"), "None"),
    )
    if not config.node_to_node_mesh_enabled and (password or password_secret):
        spec.fail("nodeMeshPassword", "cannot be set when nodeToNodeMeshEnabled is false")
    return config


def _password(spec: Fields, name: str) -> tuple[str, SecretKeyRef | None]:
    """Calico takes a password from a Secret reference (`secretKeyRef`: name, key,
    optional); pyfelix also accepts `value` inline. Errors never quote the value."""
    if not spec.has(name):
        return "", None
    password = spec.sub(name)
    password.only({"secretKeyRef", "value"})
    if password.has("value") and password.has("secretKeyRef"):
        password.fail("", "secretKeyRef and value are mutually exclusive")
    if password.has("value"):
        if not isinstance(password.raw("value"), str):
            password.fail("value", "expected a string")
        return password.raw("value"), None
    ref = password.sub("secretKeyRef", allowed={"name", "key", "optional"})
    if not ref.has("name"):
        password.fail("", "expected secretKeyRef (name, key) or value")
    secret_name = ref.str("name", required=True)
    if not _SECRET_NAME_RE.fullmatch(secret_name) or len(secret_name) > 253:
        ref.fail("name", f"{secret_name[:60]!r} is not a Secret name (a DNS subdomain)")
    key = ref.str("key", required=True)
    if not _SECRET_KEY_RE.fullmatch(key):
        ref.fail("key", f"{key[:60]!r} is not a Secret key (letters, digits, '-', '_', '.')")
    return "", SecretKeyRef(secret_name, key, ref.bool("optional"))


BGP_PEER_FIELDS = frozenset({
    "node", "peerIP", "asNumber", "nodeSelector", "peerSelector", "password", "sourceAddress",
    "maxRestartTime", "keepaliveTime", "numAllowedLocalASNumbers", "ttlSecurity", "filters",
    "reachableBy", "keepOriginalNextHop", "nextHopMode", "localWorkloadSelector",
    "reversePeering", "localASNumber",
})


def _peer_ip(spec: Fields) -> tuple[str, int | None]:
    """Calico's peerIP forms: `IP`, `IPv4:port`, `[IPv6]:port`."""
    text = spec.str("peerIP").strip()
    if not text:
        return "", None
    host, port = text, None
    if text.startswith("[") or text.count(":") == 1:
        head, _, port_text = text.rpartition(":")
        if not (is_decimal(port_text) and len(port_text) <= 5
                and 1 <= int(port_text) <= 65535):
            spec.fail("peerIP", f"invalid port in {text[:60]!r}")
        host, port = head, int(port_text)
        if text.startswith("["):
            if not head.endswith("]"):
                spec.fail("peerIP", f"invalid peer address {text[:60]!r}")
            host = head[1:-1]
    return ip_address_field(host, spec, "peerIP"), port


def parse_bgp_peer(spec: Fields, key: ResourceKey, meta: Metadata) -> BGPPeer:
    spec.only(BGP_PEER_FIELDS)
    peer_ip, port = _peer_ip(spec)
    password, password_secret = _password(spec, "password")
    filters = spec.str_list("filters")
    for i, name in enumerate(filters):
        if not _SECRET_NAME_RE.fullmatch(name) or len(name) > 253:
            spec.fail(f"filters[{i}]", f"{name[:60]!r} is not a BGPFilter name")
    reachable_by = optional_ip(spec, "reachableBy")
    peer = BGPPeer(
        key, meta,
        node=node_name(spec, "node"),
        peer_ip=peer_ip,
        as_number=_as_number(spec, "asNumber"),
        node_selector=parse_selector(spec.str("nodeSelector"), spec, "nodeSelector"),
        peer_selector=parse_selector(spec.str("peerSelector"), spec, "peerSelector"),
        password=password,
        password_secret=password_secret,
        filters=filters,
        keep_original_next_hop=spec.bool("keepOriginalNextHop"),
        source_address=spec.one_of("sourceAddress", ("UseNodeIP", "None"), "UseNodeIP"),
        max_restart_time=_duration(spec, "maxRestartTime"),
        keepalive_time=_duration(spec, "keepaliveTime"),
        port=port,
        ttl_security=spec.int("ttlSecurity", 0, lo=0, hi=255) or 0,
        reachable_by=reachable_by,
    )
    if peer.peer_selector and peer.peer_ip:
        spec.fail("peerSelector", "peerSelector and peerIP are mutually exclusive")
    if not peer.peer_selector and not peer.peer_ip:
        spec.fail("peerIP", "a BGPPeer needs peerIP or peerSelector")
    if peer.peer_ip and peer.as_number is None:
        spec.fail("asNumber", "required with peerIP")
    if peer.peer_selector and peer.as_number is not None:
        spec.fail("asNumber", "must be empty when peerSelector is given (the peers' own AS "
                  "numbers are used)")
    if peer.node and peer.node_selector:
        spec.fail("nodeSelector", "node and nodeSelector are mutually exclusive")
    if reachable_by and (not peer_ip or ipaddress.ip_address(reachable_by).version
                         != ipaddress.ip_address(peer_ip).version):
        spec.fail("reachableBy", "needs a peerIP of the same IP version")
    return peer


def _settings(spec: Fields) -> tuple[tuple[str, str], ...]:
    out = []
    for k in spec.field_names():
        v = spec.data[k]
        if not _FELIX_SETTING_RE.fullmatch(k):
            spec.fail(k, "not a FelixConfiguration setting name")
        if isinstance(v, dict | list):
            try:
                out.append((k, json.dumps(v, sort_keys=True)))
            except (TypeError, ValueError):
                spec.fail(k, "value cannot be represented as JSON")
        elif isinstance(v, bool):
            out.append((k, "true" if v else "false"))
        elif isinstance(v, str | int | float):
            try:
                out.append((k, str(v)))
            except ValueError:  # an int beyond Python's 4,300-digit str() limit
                spec.fail(k, "number too large")
        elif v is not None:
            spec.fail(k, f"unsupported value of type {type(v).__name__}")
    return tuple(sorted(out))


def parse_felix_configuration(spec: Fields, key: ResourceKey, meta: Metadata) -> FelixConfiguration:
    return FelixConfiguration(key, meta, settings=_settings(spec))


def parse_cluster_information(spec: Fields, key: ResourceKey, meta: Metadata
                              ) -> ClusterInformation:
    spec.only({"datastoreReady", "clusterGUID", "clusterType", "calicoVersion", "variant"})
    ready = spec.raw("datastoreReady")
    return ClusterInformation(
        key, meta, datastore_ready=None if ready is None else spec.bool("datastoreReady"),
        cluster_guid=spec.str("clusterGUID"), cluster_type=spec.str("clusterType"),
        calico_version=spec.str("calicoVersion"))


def parse_block_affinity(spec: Fields, key: ResourceKey, meta: Metadata) -> BlockAffinity:
    spec.only({"node", "cidr", "state", "deleted", "type"})
    deleted = spec.raw("deleted")
    if deleted is not None and not isinstance(deleted, bool | str):
        spec.fail("deleted", "expected true/false")
    return BlockAffinity(key, meta, node=node_name(spec, "node", required=True),
                         cidr=parse_net(spec.str("cidr", required=True), spec, "cidr"),
                         state=spec.one_of("state", ("confirmed", "pending",
                                                     "pendingDeletion"), "confirmed"),
                         deleted=str(deleted).lower() == "true")


# --------------------------------------------------------------------------------------------
# BGPFilter (projectcalico.org/v3): per-peer import/export rules, rendered by confd.

BGP_FILTER_FIELDS = frozenset({"exportV4", "importV4", "exportV6", "importV6"})
BGP_FILTER_RULE_FIELDS = frozenset({"action", "cidr", "matchOperator", "prefixLength",
                                    "source", "interface"})
BGP_FILTER_ACTIONS = ("Accept", "Reject")
BGP_FILTER_OPERATORS = ("Equal", "NotEqual", "In", "NotIn")
BGP_FILTER_SOURCES = ("RemotePeers",)
# Calico's bgpFilterInterface rule: 1-15 of letters, digits, '_', '.', '*', '-'; fullmatch
_BGP_FILTER_INTERFACE_RE = re.compile(r"[a-zA-Z0-9_.*-]{1,15}")


@dataclass(frozen=True, slots=True)
class BGPFilterRule:
    """One rule: every match given must hold (an empty rule always matches)."""

    action: str  # Accept | Reject
    cidr: str = ""  # normalised network of the list's family; "" with no matchOperator
    match_operator: str = ""  # Equal | NotEqual | In | NotIn
    prefix_length: tuple[int, int] | None = None  # (min, max), defaults filled in
    source: str = ""  # "" or RemotePeers (routes learned from BGP peers)
    interface: str = ""  # BIRD interface pattern ("eth*")


@dataclass(frozen=True, slots=True)
class BGPFilter(Resource):
    export_v4: tuple[BGPFilterRule, ...] = ()
    import_v4: tuple[BGPFilterRule, ...] = ()
    export_v6: tuple[BGPFilterRule, ...] = ()
    import_v6: tuple[BGPFilterRule, ...] = ()


def _bgp_filter_rule(item: Fields, family: int) -> BGPFilterRule:
    if not item.has("action"):
        item.fail("action", "required: Accept or Reject")
    action = item.one_of("action", BGP_FILTER_ACTIONS, "")
    operator = item.str("matchOperator")
    if operator and operator not in BGP_FILTER_OPERATORS:
        item.fail("matchOperator", f"{operator[:40]!r} is not one of "
                  f"{', '.join(BGP_FILTER_OPERATORS)}")
    cidr = ""
    if item.has("cidr"):
        net = parse_net(item.raw("cidr"), item, "cidr")
        if ipaddress.ip_network(net).version != family:
            item.fail("cidr", f"{net} is not an IPv{family} CIDR (this is a V{family} list)")
        cidr = net
    if bool(cidr) != bool(operator):
        item.fail("matchOperator" if cidr else "cidr",
                  "cidr and matchOperator must both be set or both be empty")
    prefix_length = None
    if item.has("prefixLength"):
        if not cidr:
            item.fail("prefixLength", "cidr is required when prefixLength is set")
        if operator not in ("In", "NotIn"):
            item.fail("prefixLength", "needs matchOperator In or NotIn (a length range "
                      "inside the CIDR)")
        bits = 32 if family == 4 else 128
        lengths = item.sub("prefixLength", allowed={"min", "max"})
        own = ipaddress.ip_network(cidr).prefixlen
        low = lengths.int("min", None, lo=0, hi=bits)
        high = lengths.int("max", None, lo=0, hi=bits)
        low = max(own, low if low is not None else own)
        high = min(bits, high if high is not None else bits)
        if low > high:
            lengths.fail("", f"empty range: from /{low} (the CIDR's own length or min) to "
                         f"/{high}")
        prefix_length = (low, high)
    source = item.str("source")
    if source and source not in BGP_FILTER_SOURCES:
        item.fail("source", f"{source[:40]!r} is not one of {', '.join(BGP_FILTER_SOURCES)}")
    interface = item.str("interface")
    if interface and not _BGP_FILTER_INTERFACE_RE.fullmatch(interface):
        item.fail("interface", f"{interface[:40]!r} is not an interface name or pattern "
                  "(1-15 letters, digits, '_', '.', '-', '*')")
    return BGPFilterRule(action, cidr, operator, prefix_length, source, interface)


def parse_bgp_filter(spec: Fields, key: ResourceKey, meta: Metadata) -> BGPFilter:
    spec.only(BGP_FILTER_FIELDS)

    def rules(name: str, family: int) -> tuple[BGPFilterRule, ...]:
        return tuple(_bgp_filter_rule(item, family)
                     for item in spec.items(name, allowed=BGP_FILTER_RULE_FIELDS))

    return BGPFilter(key, meta, export_v4=rules("exportV4", 4), import_v4=rules("importV4", 4),
                     export_v6=rules("exportV6", 6), import_v6=rules("importV6", 6))
