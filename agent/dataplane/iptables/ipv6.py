"""IPv6 (ip6tables) filter table chains for iptables mode: the workloads' IPv6 policy.

Role: what IPv6 to and from workloads meets in iptables mode. The policy, profile,
endpoint and dispatch chains are the IPv4 ones rendered by `RuleRenderer(family=6)` (IPv6
rules only, `cali60*` IP sets, ICMPv6 matches), plus each endpoint's IPv6 source check
`cali-ws-IF` (its IPv6 nets and IPv6 allowSpoofedSourcePrefixes RETURN, any other source
DROPs "pyfelix: spoofed source"), which its `cali-fw-IF` jumps to first (ip6tables has no
raw-table check of ours). This module adds the static chains and the base-chain inserts;
pure functions, no kernel access. `IptablesManager` programs them into a second
`IptablesTable` (family 6, same backend as IPv4) in the same apply().

Static chains ("cali+" stands for every configured interface prefix):

    FORWARD ─(our insert)─> cali-FORWARD
        clear our marks; -i cali+ -> cali-from-wl-dispatch (workload egress);
        -o cali+ -> cali-to-wl-dispatch (workload ingress); ACCEPT mark -> ACCEPT
    INPUT ─(our insert)─> cali-INPUT
        -i cali+ ICMPv6 130,131,132 (MLD), 133 (router solicitation), 135,136 (neighbour
                 solicitation/advertisement), 143 (MLDv2 report) -> ACCEPT
        -i cali+ goto cali-wl-to-host: the workload's egress policy, then
                 DefaultEndpointToHostAction
    OUTPUT ─(our insert)─> cali-OUTPUT
        -o cali+ ICMPv6 130,131,132, 134 (router advertisement), 135,136, 143 -> ACCEPT
        ACCEPT mark -> ACCEPT; -o cali+ RETURN (host to workload: its ingress policy is
        not applied to the host's own packets, as for IPv4)

Neighbour discovery and MLD come before any policy (a link needs them; they are
link-local, so the source check, which they would fail with their fe80:: sources, never
sees them). Traffic not on a workload interface (the host's own IPv6) falls off the end
of our chains. Not rendered for IPv6: host endpoint policy, preDNAT and doNotTrack rules,
failsafes (the host's IPv6 is not policed), the IPVS rules.

With Ipv6Support false (`ipv6_disabled_static_chains`) there is no IPv6 policy at all: the
same three base-chain jumps lead to chains that accept neighbour discovery / MLD and drop
every other IPv6 packet from or to a workload interface (comment "pyfelix: Ipv6Support
false"; the rules' counters count them), as the BPF programs do with CFG_IPV6_DISABLED.
"""

from __future__ import annotations

from pyfelix.agent.dataplane.iptables.chains import Chain
from pyfelix.agent.dataplane.iptables.names import (
    CHAIN_FORWARD,
    CHAIN_FROM_WL_DISPATCH,
    CHAIN_INPUT,
    CHAIN_OUTPUT,
    CHAIN_TO_WL_DISPATCH,
    CHAIN_WL_TO_HOST,
    COMMENT_IPV6_DISABLED,
    IPSET_ALL_VXLAN6,
    reason_comment,
)
from pyfelix.agent.dataplane.iptables.render import (
    ENDPOINT_TO_HOST_ACTIONS,
    RuleRenderer,
    match_mark,
    set_mark,
)

# ICMPv6 types a workload sends to the host: MLD query/report/done (130-132), router
# solicitation (133), neighbour solicitation/advertisement (135, 136), MLDv2 report (143).
ICMPV6_TO_HOST = (130, 131, 132, 133, 135, 136, 143)
# ... and the host sends to a workload: the same, with router advertisement (134) instead
# of solicitation.
ICMPV6_FROM_HOST = (130, 131, 132, 134, 135, 136, 143)


def icmpv6_accept(direction: str, wildcard: str, icmp_type: int) -> str:
    return f"{direction} {wildcard} -p ipv6-icmp -m icmp6 --icmpv6-type {icmp_type} -j ACCEPT"


def ipv6_base_chain_inserts() -> dict[str, tuple[str, ...]]:
    """Our rules at the top of the kernel's own chains of the ip6tables filter table."""
    return {"INPUT": (f"-j {CHAIN_INPUT}",), "FORWARD": (f"-j {CHAIN_FORWARD}",),
            "OUTPUT": (f"-j {CHAIN_OUTPUT}",)}


def ipv6_workload_static_chains(renderer: RuleRenderer, *,
                                vxlan_port: int | None = None) -> list[Chain]:
    """cali-FORWARD, cali-INPUT, cali-wl-to-host and cali-OUTPUT of the ip6tables filter
    table with IPv6 policy (iptables mode): the IPv4 layout for workloads, with the
    neighbour discovery / MLD accepts first, and no host endpoint rules (host endpoints'
    IPv6 is not policed; see the module docstring).

        cali-FORWARD: clear our marks; -i cali+ -> cali-from-wl-dispatch;
                      -o cali+ -> cali-to-wl-dispatch; ACCEPT mark -> ACCEPT
        cali-INPUT:   -i cali+ ND/MLD -> ACCEPT; -i cali+ goto cali-wl-to-host
        cali-wl-to-host: -> cali-from-wl-dispatch; DefaultEndpointToHostAction
        cali-OUTPUT:  -o cali+ ND/MLD -> ACCEPT; ACCEPT mark -> ACCEPT; -o cali+ RETURN

    With `vxlan_port` (IPv6 VTEPs exist, vxlan-v6.calico), as IPv4 does for vxlan.calico:
    cali-INPUT first accepts UDP to that port only from `cali60all-vxlan-net` (the IPv6
    VTEPs' parent addresses) and drops the rest; cali-OUTPUT accepts it to them.
    """
    if renderer.family != 6:
        raise ValueError("ipv6_workload_static_chains: needs the IPv6 renderer")
    m = renderer.marks
    wildcards = [f"{p}+" for p in renderer.interface_prefixes]
    accepted = f"{match_mark(m.accept, m.accept)} -j ACCEPT"
    forward = ([set_mark(0, m.all)]
               + [f"-i {w} -j {CHAIN_FROM_WL_DISPATCH}" for w in wildcards]
               + [f"-o {w} -j {CHAIN_TO_WL_DISPATCH}" for w in wildcards]
               + [accepted])
    input_rules: list[str] = []
    tunnel_output: list[str] = []
    if vxlan_port is not None:
        vxlan = f"-p udp --dport {vxlan_port}"
        input_rules += [f"{vxlan} -m set --match-set {IPSET_ALL_VXLAN6} src -j ACCEPT",
                        f"{vxlan} -j DROP"]
        tunnel_output.append(f"{vxlan} -m set --match-set {IPSET_ALL_VXLAN6} dst -j ACCEPT")
    input_rules += [icmpv6_accept("-i", w, t) for w in wildcards for t in ICMPV6_TO_HOST]
    input_rules += [f"-i {w} -g {CHAIN_WL_TO_HOST}" for w in wildcards]
    to_host = ENDPOINT_TO_HOST_ACTIONS[renderer.endpoint_to_host_action.lower()]
    wl_to_host = [f"-j {CHAIN_FROM_WL_DISPATCH}", f"-j {to_host}"]
    output = tunnel_output + [icmpv6_accept("-o", w, t) for w in wildcards
                              for t in ICMPV6_FROM_HOST]
    output.append(accepted)
    output += [f"-o {w} -j RETURN" for w in wildcards]
    return [Chain(CHAIN_FORWARD, tuple(forward)), Chain(CHAIN_INPUT, tuple(input_rules)),
            Chain(CHAIN_WL_TO_HOST, tuple(wl_to_host)), Chain(CHAIN_OUTPUT, tuple(output))]


def ipv6_disabled_static_chains(interface_prefixes: tuple[str, ...]) -> list[Chain]:
    """cali-FORWARD, cali-INPUT and cali-OUTPUT with Ipv6Support false: neighbour discovery
    and MLD accepted on workload links, every other workload IPv6 packet dropped (counted by
    the rules' counters), nothing else of ours in ip6tables.

        cali-FORWARD: -i cali+ DROP; -o cali+ DROP
        cali-INPUT:   -i cali+ ND/MLD -> ACCEPT; -i cali+ DROP
        cali-OUTPUT:  -o cali+ ND/MLD -> ACCEPT; -o cali+ DROP
    """
    wildcards = [f"{p}+" for p in interface_prefixes]
    drop = f"{reason_comment(COMMENT_IPV6_DISABLED)} -j DROP"
    forward = [f"-i {w} {drop}" for w in wildcards] + [f"-o {w} {drop}" for w in wildcards]
    input_rules = [icmpv6_accept("-i", w, t) for w in wildcards for t in ICMPV6_TO_HOST]
    input_rules += [f"-i {w} {drop}" for w in wildcards]
    output = [icmpv6_accept("-o", w, t) for w in wildcards for t in ICMPV6_FROM_HOST]
    output += [f"-o {w} {drop}" for w in wildcards]
    return [Chain(CHAIN_FORWARD, tuple(forward)), Chain(CHAIN_INPUT, tuple(input_rules)),
            Chain(CHAIN_OUTPUT, tuple(output))]
