"""Build a scenario's network: underlay, node namespaces, pod namespaces, veths, routes.

Role: the lab's "cluster + CNI plugin". Creates, with pyroute2, only inside namespaces named
by `lab.naming` for this run:

    underlay ns  pfXXXXXX-ul      bridge br0 198.19.255.254/15 (the `external` probe
                                   client), ports n0..nK
                                   | veth
    node ns      pfXXXXXX-n-NODE  eth0 198.18.0.(i+1)/15, one cali<hash> per local pod
                                   | veth (host side cali<hash>, MAC ee:ee:ee:ee:ee:ee)
    pod ns       pfXXXXXX-p-NS.POD eth0 POD_IP/32, 169.254.1.1 dev eth0 scope link,
                                   default via 169.254.1.1, permanent neighbour
                                   169.254.1.1 -> ee:ee:ee:ee:ee:ee

Inputs: a validated `Scenario`, the run id, and two switches:
- `program_routes` (default True): the lab does Felix's part of pod networking itself:
  ip_forward=1 in node namespaces, proxy_arp=1 on each cali interface, and a /32 route to each
  local pod via its cali interface. Turn it off once the agent's route manager does it.
- `static_cross_node_routes` (default False): a /32 route per remote pod via the owning
  node's underlay IP, standing in for BGP until BIRD runs in the lab.
Outputs: `LabTopology` (namespace names, underlay IPs, interface names) for probes, servers
and, later, for starting one agent (and BIRD) per node namespace.

Invariants:
- Nothing is created in the caller's namespace: every netlink socket is opened inside a lab
  namespace (pyroute2 `IPRoute(netns=...)`), and veth peers are created directly inside the
  peer namespace (`net_ns_fd`), never in the root namespace and moved.
- The pod side is what Calico's CNI plugin does (the lab's job with or without an agent);
  the node side is what Felix does (the `program_routes` switch).
- Lab routes use protocol `static` (4), so they are told apart from the agent's and BIRD's.

IPv6 (`lab.family`, --ip-family ipv6 or dual): pods get their IPv6 twin address as a /128
and a default route via fe80::ecee:eeff:feee:eeee (the host-side veth's own link-local
address, from its fixed MAC, as Calico's CNI plugin sets it) with a permanent neighbour
entry; nodes and the `external` client get their underlay twins beside the IPv4 ones.
Duplicate address detection is off in every lab namespace (accept_dad=0, addresses added
`nodad`): a tentative address would drop the first probes of a fresh lab.

Easy to get wrong: proxy ARP answers only for destinations the node has a unicast route to,
and lab node namespaces have no default route, so the pod also gets a permanent neighbour
entry for the gateway (the host-side MAC is fixed, as Calico fixes it) and never needs ARP
for 169.254.1.1.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from pyroute2 import IPRoute

from pyfelix.lab import naming
from pyfelix.lab.family import POD_GATEWAY6, external_client_ipv6, ipv6_interface_for
from pyfelix.lab.netns import create_netns, write_sysctl
from pyfelix.lab.scenario import (
    EXTERNAL_CLIENT_IP,
    POD_GATEWAY,
    UNDERLAY_NETWORK,
    PodSpec,
    Scenario,
    node_underlay_ip,
)

HOST_SIDE_MAC = "ee:ee:ee:ee:ee:ee"
UNDERLAY_BRIDGE = "br0"
NODE_UNDERLAY_IFNAME = "eth0"
POD_IFNAME = "eth0"
RTPROT_STATIC = 4
RT_SCOPE_LINK = 253
NUD_PERMANENT = 0x80
IFA_F_NODAD = 0x02


@dataclass(frozen=True)
class NodeHandle:
    name: str
    index: int
    netns: str
    underlay_ip: ipaddress.IPv4Interface  # e.g. 198.18.0.1/15
    # its twin (lab.family) under --ip-family ipv6 / dual, else None
    underlay_ip6: ipaddress.IPv6Interface | None = None

    @property
    def ip(self) -> ipaddress.IPv4Address:
        return self.underlay_ip.ip


@dataclass(frozen=True)
class PodHandle:
    spec: PodSpec
    netns: str
    host_ifname: str
    node: NodeHandle

    @property
    def key(self) -> str:
        return self.spec.key


@dataclass
class LabTopology:
    run_id: str
    underlay_netns: str
    nodes: dict[str, NodeHandle] = field(default_factory=dict)
    pods: dict[str, PodHandle] = field(default_factory=dict)
    ip_family: str = "ipv4"  # the scenario's (lab.family)

    @property
    def netns_names(self) -> list[str]:
        return (
            [p.netns for p in self.pods.values()]
            + [n.netns for n in self.nodes.values()]
            + [self.underlay_netns]
        )


def underlay_ip_for(node_index: int) -> ipaddress.IPv4Interface:
    address = node_underlay_ip(node_index)
    return ipaddress.IPv4Interface(f"{address}/{UNDERLAY_NETWORK.prefixlen}")


def plan_topology(
    run_id: str, scenario: Scenario, interface_prefix: str = naming.DEFAULT_INTERFACE_PREFIX
) -> LabTopology:
    """Names and addresses for every object, before anything is created (pure)."""
    topology = LabTopology(run_id=run_id, underlay_netns=naming.underlay_netns(run_id),
                           ip_family=scenario.ip_family)
    for index, node in enumerate(scenario.nodes):
        underlay = underlay_ip_for(index)
        topology.nodes[node] = NodeHandle(
            name=node,
            index=index,
            netns=naming.node_netns(run_id, index, node),
            underlay_ip=underlay,
            underlay_ip6=None if scenario.ip_family == "ipv4" else ipv6_interface_for(underlay),
        )
    for index, pod in enumerate(scenario.pods):
        topology.pods[pod.key] = PodHandle(
            spec=pod,
            netns=naming.pod_netns(run_id, index, pod.namespace, pod.name),
            host_ifname=naming.workload_interface_name(pod.namespace, pod.name, interface_prefix),
            node=topology.nodes[pod.node],
        )
    return topology


@contextmanager
def _netlink(netns: str) -> Iterator[IPRoute]:
    ipr = IPRoute(netns=netns)
    try:
        yield ipr
    finally:
        ipr.close()


def _index(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise RuntimeError(f"interface {ifname} not found after creating it")
    return int(found[0])


class TopologyBuilder:
    """Creates a planned topology; partial builds are cleaned up by the runner's teardown."""

    def __init__(
        self,
        topology: LabTopology,
        *,
        program_routes: bool = True,
        static_cross_node_routes: bool = False,
    ) -> None:
        self.topology = topology
        self.program_routes = program_routes
        self.static_cross_node_routes = static_cross_node_routes

    def build(self) -> LabTopology:
        for name in self.topology.netns_names:
            create_netns(name)
            if self.topology.ip_family != "ipv4":
                for conf in ("all", "default"):
                    write_sysctl(name, f"net.ipv6.conf.{conf}.accept_dad", "0")
        self._build_underlay()
        for node in self.topology.nodes.values():
            self._build_node(node)
        return self.topology

    def _build_underlay(self) -> None:
        with _netlink(self.topology.underlay_netns) as ipr:
            ipr.link("set", index=_index(ipr, "lo"), state="up")
            ipr.link("add", ifname=UNDERLAY_BRIDGE, kind="bridge")
            bridge = _index(ipr, UNDERLAY_BRIDGE)
            ipr.link("set", index=bridge, state="up")
            # the `external` probe source: a client on the underlay that runs no agent
            ipr.addr("add", index=bridge, address=str(EXTERNAL_CLIENT_IP.ip),
                     prefixlen=EXTERNAL_CLIENT_IP.network.prefixlen)
            if self.topology.ip_family != "ipv4":
                external6 = external_client_ipv6()
                ipr.addr("add", index=bridge, address=str(external6.ip),
                         prefixlen=external6.network.prefixlen, flags=IFA_F_NODAD)
            for node in self.topology.nodes.values():
                port = naming.underlay_port_name(node.index)
                ipr.link(
                    "add",
                    ifname=port,
                    kind="veth",
                    peer={"ifname": NODE_UNDERLAY_IFNAME, "net_ns_fd": node.netns},
                )
                ipr.link("set", index=_index(ipr, port), master=bridge, state="up")

    def _build_node(self, node: NodeHandle) -> None:
        local_pods = [p for p in self.topology.pods.values() if p.node.name == node.name]
        with _netlink(node.netns) as ipr:
            ipr.link("set", index=_index(ipr, "lo"), state="up")
            eth0 = _index(ipr, NODE_UNDERLAY_IFNAME)
            ipr.addr(
                "add",
                index=eth0,
                address=str(node.underlay_ip.ip),
                prefixlen=node.underlay_ip.network.prefixlen,
            )
            if node.underlay_ip6 is not None:
                ipr.addr("add", index=eth0, address=str(node.underlay_ip6.ip),
                         prefixlen=node.underlay_ip6.network.prefixlen, flags=IFA_F_NODAD)
            ipr.link("set", index=eth0, state="up")
            for pod in local_pods:
                self._wire_pod(ipr, pod)
            if self.static_cross_node_routes:
                self._add_cross_node_routes(ipr, node, eth0)
        # no ICMP redirects: the underlay is one flat segment, and a redirect (sent when a
        # node forwards a NodePort packet back out of eth0) uses the per-peer ICMP rate
        # state, so the next REJECTs to that client would be rate-limited away
        for conf in ("all", NODE_UNDERLAY_IFNAME):
            write_sysctl(node.netns, f"net.ipv4.conf.{conf}.send_redirects", "0")
        if self.topology.ip_family != "ipv4":
            # IPv6 has no send_redirects switch; its redirects share the per-peer ICMPv6
            # rate state with the REJECTs (icmp6-port-unreachable): no per-peer limit
            write_sysctl(node.netns, "net.ipv6.icmp.ratelimit", "0")
        if self.program_routes:
            write_sysctl(node.netns, "net.ipv4.ip_forward", "1")
            if self.topology.ip_family != "ipv4":
                write_sysctl(node.netns, "net.ipv6.conf.all.forwarding", "1")
            for pod in local_pods:
                write_sysctl(node.netns, f"net.ipv4.conf.{pod.host_ifname}.proxy_arp", "1")

    def _wire_pod(self, node_ipr: IPRoute, pod: PodHandle) -> None:
        """The CNI plugin's part (veth, pod address and routes) plus, if on, Felix's route."""
        node_ipr.link(
            "add",
            ifname=pod.host_ifname,
            kind="veth",
            address=HOST_SIDE_MAC,
            peer={"ifname": POD_IFNAME, "net_ns_fd": pod.netns},
        )
        host_index = _index(node_ipr, pod.host_ifname)
        node_ipr.link("set", index=host_index, state="up")
        with _netlink(pod.netns) as ipr:
            ipr.link("set", index=_index(ipr, "lo"), state="up")
            eth0 = _index(ipr, POD_IFNAME)
            for address in pod.spec.addresses:
                ipr.addr("add", index=eth0, address=str(address),
                         prefixlen=address.max_prefixlen,
                         **({"flags": IFA_F_NODAD} if address.version == 6 else {}))
            ipr.link("set", index=eth0, state="up")
            if pod.spec.has_ipv4:
                ipr.neigh("add", dst=str(POD_GATEWAY), lladdr=HOST_SIDE_MAC, ifindex=eth0,
                          state=NUD_PERMANENT)
                ipr.route("add", dst=f"{POD_GATEWAY}/32", oif=eth0, scope=RT_SCOPE_LINK,
                          proto=RTPROT_STATIC)
                ipr.route("add", dst="0.0.0.0/0", gateway=str(POD_GATEWAY), oif=eth0,
                          proto=RTPROT_STATIC)
            if pod.spec.ipv6 is not None:
                ipr.neigh("add", dst=str(POD_GATEWAY6), lladdr=HOST_SIDE_MAC, ifindex=eth0,
                          state=NUD_PERMANENT, family=socket.AF_INET6)
                ipr.route("add", dst="::/0", gateway=str(POD_GATEWAY6), oif=eth0,
                          proto=RTPROT_STATIC, family=socket.AF_INET6)
        if self.program_routes:
            for address in pod.spec.addresses:
                node_ipr.route(
                    "add",
                    dst=f"{address}/{address.max_prefixlen}",
                    oif=host_index,
                    scope=RT_SCOPE_LINK,
                    proto=RTPROT_STATIC,
                    **({"family": socket.AF_INET6} if address.version == 6 else {}),
                )

    def _add_cross_node_routes(self, ipr: IPRoute, node: NodeHandle, eth0: int) -> None:
        for pod in self.topology.pods.values():
            if pod.node.name == node.name:
                continue
            for address in pod.spec.addresses:
                via = pod.node.underlay_ip6 if address.version == 6 else pod.node.underlay_ip
                assert via is not None  # a pod has IPv6 only when its node has it
                ipr.route(
                    "add",
                    dst=f"{address}/{address.max_prefixlen}",
                    gateway=str(via.ip),
                    oif=eth0,
                    proto=RTPROT_STATIC,
                    **({"family": socket.AF_INET6} if address.version == 6 else {}),
                )
