"""Typed messages from the calculation graph to the dataplane: the Python twin of Felix's proto.

Role: the one contract between `agent.calc` (producer, via the event sequencer) and every
dataplane driver (consumers: BPF, iptables, routes, the recording fake used in tests).

Invariants a consumer may rely on (the event sequencer guarantees them):
- an IP set is created (`IPSetUpdate`) before any policy that references its id is sent, and
  removed (`IPSetRemove`) only after every policy using it has been updated or removed;
- a policy or profile is sent before any endpoint listing it, and removed only after;
- `InSync` is sent once, after the first complete flush following datastore in-sync.

Messages are frozen dataclasses; collections are tuples/frozensets so they hash and compare.
Rules arrive fully resolved: selectors have become IP-set ids; protocol names are numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# --- what decided a packet -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RuleMeta:
    """The rule a verdict came from, in the same words on both dataplanes (BPF rule counters,
    iptables NFLOG prefixes, flow logs, metrics): kind "policy" | "profile" | "tier-end" |
    "default-deny", tier ("" for profiles and the final deny), owner (policy or profile
    name), the endpoint's direction ("ingress" | "egress"), the rule's index in its owner
    (-1 for the denies) and action ("allow" | "deny")."""

    kind: str
    tier: str
    owner: str
    direction: str
    index: int
    action: str


# --- identifiers ---------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class PolicyID:
    """A policy's identity. `name` is `<name>` (global) or `<namespace>/<name>` (namespaced)."""

    tier: str
    name: str


@dataclass(frozen=True, order=True)
class WorkloadEndpointID:
    """Calico's workload endpoint identity; for Kubernetes `workload` is `<namespace>/<pod>`."""

    orchestrator: str
    workload: str
    endpoint: str


@dataclass(frozen=True, order=True)
class HostEndpointID:
    endpoint: str


# --- rules ---------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class PortRange:
    """An inclusive port range; a single port has first == last."""

    first: int
    last: int


@dataclass(frozen=True)
class Rule:
    """One resolved rule. Empty tuples mean "no constraint on this field".

    Match semantics (identical in every dataplane):
    - protocol: packet protocol == protocol; not_protocol: != not_protocol.
    - *_nets: address in ANY of the nets; not_*_nets: in NONE of them.
    - *_ip_set_ids: address in EVERY listed set (a selector and a namespaceSelector are already
      combined into one set, so the list is normally 0 or 1 long); not_*_ip_set_ids: in NONE.
    - ports: the port is in ANY of `*_ports` OR (address, protocol, port) is in ANY of
      `*_named_port_ip_set_ids`; a rule with neither has no port constraint.
      not_*_ports / not_*_named_port_ip_set_ids: in NONE.
    - icmp_type/icmp_code: for ICMP packets; not_icmp_*: the negation.
    """

    action: str  # "allow" | "deny" | "pass" | "log"
    ip_version: int | None = None  # 4 or 6, None for both
    protocol: int | None = None
    not_protocol: int | None = None
    src_nets: tuple[str, ...] = ()
    not_src_nets: tuple[str, ...] = ()
    dst_nets: tuple[str, ...] = ()
    not_dst_nets: tuple[str, ...] = ()
    src_ip_set_ids: tuple[str, ...] = ()
    not_src_ip_set_ids: tuple[str, ...] = ()
    dst_ip_set_ids: tuple[str, ...] = ()
    not_dst_ip_set_ids: tuple[str, ...] = ()
    src_ports: tuple[PortRange, ...] = ()
    not_src_ports: tuple[PortRange, ...] = ()
    dst_ports: tuple[PortRange, ...] = ()
    not_dst_ports: tuple[PortRange, ...] = ()
    src_named_port_ip_set_ids: tuple[str, ...] = ()
    not_src_named_port_ip_set_ids: tuple[str, ...] = ()
    dst_named_port_ip_set_ids: tuple[str, ...] = ()
    not_dst_named_port_ip_set_ids: tuple[str, ...] = ()
    icmp_type: int | None = None
    icmp_code: int | None = None
    not_icmp_type: int | None = None
    not_icmp_code: int | None = None
    # Stable identity for per-rule counters and iptables comments: hash of the rule's content
    # plus its owning policy and position, computed by the calc graph.
    rule_id: str = ""

    def ip_set_ids(self) -> frozenset[str]:
        """Every IP-set id this rule references (for dependency tracking)."""
        return frozenset(
            self.src_ip_set_ids
            + self.not_src_ip_set_ids
            + self.dst_ip_set_ids
            + self.not_dst_ip_set_ids
            + self.src_named_port_ip_set_ids
            + self.not_src_named_port_ip_set_ids
            + self.dst_named_port_ip_set_ids
            + self.not_dst_named_port_ip_set_ids
        )


@dataclass(frozen=True)
class Policy:
    """A resolved policy. `namespace` is "" for global policies."""

    namespace: str = ""
    inbound_rules: tuple[Rule, ...] = ()
    outbound_rules: tuple[Rule, ...] = ()
    untracked: bool = False  # doNotTrack
    pre_dnat: bool = False
    apply_on_forward: bool = False


@dataclass(frozen=True)
class Profile:
    inbound_rules: tuple[Rule, ...] = ()
    outbound_rules: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class TierInfo:
    """The policies of one tier that apply to an endpoint, in evaluation order."""

    name: str
    ingress_policies: tuple[str, ...] = ()  # PolicyID.name values, in order
    egress_policies: tuple[str, ...] = ()
    default_action: str = "deny"  # "deny" | "pass"


@dataclass(frozen=True)
class WorkloadEndpoint:
    state: str  # "active" | "inactive"
    name: str  # interface name, e.g. cali1234abcd567
    mac: str = ""
    profile_ids: tuple[str, ...] = ()
    ipv4_nets: tuple[str, ...] = ()
    ipv6_nets: tuple[str, ...] = ()
    tiers: tuple[TierInfo, ...] = ()
    # sources the workload may send from besides ipv4_nets/ipv6_nets (Calico's
    # allowSpoofedSourcePrefixes); every other source is dropped (RPF)
    allow_spoofed_source_prefixes: tuple[str, ...] = ()
    # floating IPs (the WorkloadEndpoint's ipNATs, split by IP version as Felix's
    # ipv4_nat / ipv6_nat): programmed only with FloatingIPs Enabled (IPv6: and Ipv6Support)
    ipv4_nat: tuple[NatInfo, ...] = ()
    ipv6_nat: tuple[NatInfo, ...] = ()


@dataclass(frozen=True, order=True)
class NatInfo:
    """One floating IP: traffic to `ext_ip` is DNATed to the workload's `int_ip`."""

    ext_ip: str
    int_ip: str


@dataclass(frozen=True)
class HostEndpoint:
    # interface name; "*" for all host interfaces; "" when the endpoint is known only by its
    # expected IPs (it applies to the interfaces that carry them)
    name: str
    profile_ids: tuple[str, ...] = ()
    expected_ipv4_addrs: tuple[str, ...] = ()
    expected_ipv6_addrs: tuple[str, ...] = ()
    tiers: tuple[TierInfo, ...] = ()
    untracked_tiers: tuple[TierInfo, ...] = ()
    pre_dnat_tiers: tuple[TierInfo, ...] = ()
    forward_tiers: tuple[TierInfo, ...] = ()


# --- messages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class IPSetUpdate:
    """Create or replace an IP set. Members: `<cidr>` or `<cidr>,<proto>:<port>` (IP_PORT)."""

    id: str
    type: str  # "net" | "ip_port"
    members: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class IPSetDeltaUpdate:
    id: str
    added: frozenset[str] = field(default_factory=frozenset)
    removed: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class IPSetRemove:
    id: str


@dataclass(frozen=True)
class ActivePolicyUpdate:
    id: PolicyID
    policy: Policy


@dataclass(frozen=True)
class ActivePolicyRemove:
    id: PolicyID


@dataclass(frozen=True)
class ActiveProfileUpdate:
    id: str
    profile: Profile


@dataclass(frozen=True)
class ActiveProfileRemove:
    id: str


@dataclass(frozen=True)
class WorkloadEndpointUpdate:
    id: WorkloadEndpointID
    endpoint: WorkloadEndpoint


@dataclass(frozen=True)
class WorkloadEndpointRemove:
    id: WorkloadEndpointID


@dataclass(frozen=True)
class HostEndpointUpdate:
    id: HostEndpointID
    endpoint: HostEndpoint


@dataclass(frozen=True)
class HostEndpointRemove:
    id: HostEndpointID


@dataclass(frozen=True)
class HostMetadataUpdate:
    hostname: str
    ipv4_addr: str


@dataclass(frozen=True)
class HostMetadataRemove:
    hostname: str


@dataclass(frozen=True)
class IPAMPoolUpdate:
    id: str  # the pool's CIDR
    cidr: str
    masquerade: bool = False
    ipip_mode: str = "Never"
    vxlan_mode: str = "Never"
    disabled: bool = False
    disable_bgp_export: bool = False


@dataclass(frozen=True)
class IPAMPoolRemove:
    id: str


@dataclass(frozen=True, slots=True)
class RouteUpdate:
    """A route the dataplane should know: local workload /32s and remote hosts' blocks."""

    dst: str
    type: str  # "local_workload" | "remote_workload" | "remote_host" | "local_host"
    dst_node: str = ""
    dst_node_ip: str = ""
    local_workload_iface: str = ""
    ip_pool_type: str = ""  # "" | "vxlan" | "ipip"
    nat_outgoing: bool = False


@dataclass(frozen=True)
class RouteRemove:
    dst: str


@dataclass(frozen=True)
class VXLANTunnelEndpointUpdate:
    """A node's VXLAN tunnel endpoint (VTEP), Felix's message of the same name.

    `ipv4_addr` is the VTEP's overlay address (on the node's `vxlan.calico` device), `mac`
    the device's MAC, `parent_device_ip` the node's underlay address VXLAN packets are sent
    to. Sent before any route that goes through it, removed after the last such route.
    The IPv6 fields are Felix's `Ipv6Addr`/`MacV6`/`ParentDeviceIpv6`: the node's VTEP on
    `vxlan-v6.calico`, set while an IPv6 VXLAN pool exists and the node has a host IPv6
    address ("" otherwise; the IPv4 fields are "" when only the IPv6 VTEP exists)."""

    node: str
    mac: str
    ipv4_addr: str
    parent_device_ip: str
    ipv6_addr: str = ""
    mac_v6: str = ""
    parent_device_ipv6: str = ""


@dataclass(frozen=True)
class VXLANTunnelEndpointRemove:
    node: str


@dataclass(frozen=True)
class IPIPTunnelUpdate:
    """A node's IPIP tunnel: `ipv4_addr` is the address of its `tunl0` (the Node's
    `bgp.ipv4IPIPTunnelAddr`, else derived from the first IPIP pool; "" when neither),
    `parent_device_ip` the host address IPIP packets to and from it use. Sent for every node
    while an IPIP pool exists; the IPIP manager finds its own by the parent address and
    admits IPIP only from the others' parent addresses."""

    node: str
    ipv4_addr: str
    parent_device_ip: str


@dataclass(frozen=True)
class IPIPTunnelRemove:
    node: str


@dataclass(frozen=True, order=True)
class ServiceBackend:
    """One backend of a service frontend: a ready endpoint's address and target port."""

    addr: str
    port: int
    node: str = ""  # the node the endpoint runs on ("" when the slice does not say)


@dataclass(frozen=True)
class ServiceFrontendUpdate:
    """A service frontend for this node: traffic to (vip, port, protocol) goes to one of
    `backends` (sorted; empty: reject, as kube-proxy does for a Service without ready
    endpoints). `id` is `<vip>:<port>/<protocol number>`, the frontend map's key.
    `affinity_timeout` > 0: ClientIP session affinity for that many seconds. `kind` is
    "cluster" (a ClusterIP), "external" (externalIPs, load balancer ingress IPs) or
    "nodeport" (`vip` NODEPORT_VIP / NODEPORT_VIP6: any of this node's IPv4 / IPv6
    addresses, on a host interface).
    `traffic_local`: the backends are limited to this node's (internal/external traffic
    policy Local)."""

    id: str
    service: str  # "<namespace>/<name>"
    port_name: str
    vip: str
    port: int
    protocol: int
    kind: str = "cluster"
    backends: tuple[ServiceBackend, ...] = ()
    affinity_timeout: int = 0
    traffic_local: bool = False


NODEPORT_VIP = "0.0.0.0"  # a NodePort frontend's address: any of the node's own
NODEPORT_VIP6 = "::"  # an IPv6 NodePort frontend's: any of the node's IPv6 addresses


@dataclass(frozen=True)
class ServiceFrontendRemove:
    id: str


@dataclass(frozen=True)
class DatastoreReady:
    """ClusterInformation `default`'s datastoreReady: False pauses every kernel write (the
    dataplane stays as programmed) until it turns True again."""

    ready: bool


@dataclass(frozen=True)
class ConfigUpdate:
    """Effective Felix configuration (strings, as Felix sends them) after datastore overlay."""

    config: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class InSync:
    """Sent once: every update that was in the datastore at start-up has been flushed."""


Message = (
    IPSetUpdate
    | IPSetDeltaUpdate
    | IPSetRemove
    | ActivePolicyUpdate
    | ActivePolicyRemove
    | ActiveProfileUpdate
    | ActiveProfileRemove
    | WorkloadEndpointUpdate
    | WorkloadEndpointRemove
    | HostEndpointUpdate
    | HostEndpointRemove
    | HostMetadataUpdate
    | HostMetadataRemove
    | IPAMPoolUpdate
    | IPAMPoolRemove
    | RouteUpdate
    | RouteRemove
    | VXLANTunnelEndpointUpdate
    | VXLANTunnelEndpointRemove
    | ServiceFrontendUpdate
    | ServiceFrontendRemove
    | ConfigUpdate
    | DatastoreReady
    | InSync
)
