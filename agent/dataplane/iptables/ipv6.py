"""IPv6 renderer: the ip6tables filter table's chains (iptables mode).

Role: what IPv6 to and from workloads meets in iptables mode. There is no IPv6 policy yet,
so these chains fail closed: IPv6 between pods, from pods to the host or the outside, and to
pods is dropped, except the ICMPv6 a link needs (neighbour discovery and MLD between a
workload and the host). Pure functions; no kernel access. `IptablesManager` programs them
into a second `IptablesTable` (family 6, same backend as IPv4) in the same apply().

Chains (same names as the IPv4 filter table's, in ip6tables; "cali+" stands for every
configured interface prefix):

    INPUT ─(our insert)─> cali-INPUT
        -i cali+ ICMPv6 130,131,132 (MLD), 133 (router solicitation), 135,136 (neighbour
                 solicitation/advertisement), 143 (MLDv2 report) -> ACCEPT
        -i cali+ -> DROP "pyfelix: ipv6 not policed"
    FORWARD ─(our insert)─> cali-FORWARD
        -i cali+ -> DROP "pyfelix: ipv6 not policed"
        -o cali+ -> DROP "pyfelix: ipv6 not policed"
    OUTPUT ─(our insert)─> cali-OUTPUT
        -o cali+ ICMPv6 130,131,132, 134 (router advertisement), 135,136, 143 -> ACCEPT
        -o cali+ -> DROP "pyfelix: ipv6 not policed"

Traffic not on a workload interface (the host's own IPv6) falls off the end of our chains
and goes on to the kernel chains' other rules. Each DROP carries a second comment, so
`ip6tables-save -c` says why its packets went.

Extension point: IPv6 policy will replace each workload DROP by a jump to the IPv6 workload
dispatch chains (the layout of `RuleRenderer.static_chains`), keeping the ICMPv6 accepts
first; the manager already owns the table, its inserts and its diffing.
"""

from __future__ import annotations

from agent.dataplane.iptables.chains import Chain
from agent.dataplane.iptables.names import (
    CHAIN_FORWARD,
    CHAIN_INPUT,
    CHAIN_OUTPUT,
    COMMENT_IPV6_NOT_POLICED,
    reason_comment,
)

# ICMPv6 types a workload sends to the host: MLD query/report/done (130-132), router
# solicitation (133), neighbour solicitation/advertisement (135, 136), MLDv2 report (143).
ICMPV6_TO_HOST = (130, 131, 132, 133, 135, 136, 143)
# ... and the host sends to a workload: the same, with router advertisement (134) instead
# of solicitation.
ICMPV6_FROM_HOST = (130, 131, 132, 134, 135, 136, 143)


def icmpv6_accept(direction: str, wildcard: str, icmp_type: int) -> str:
    return f"{direction} {wildcard} -p ipv6-icmp -m icmp6 --icmpv6-type {icmp_type} -j ACCEPT"


def ipv6_static_chains(interface_prefixes: tuple[str, ...]) -> list[Chain]:
    """cali-INPUT, cali-FORWARD and cali-OUTPUT of the ip6tables filter table (see above)."""
    if not interface_prefixes or not all(interface_prefixes):
        raise ValueError("interface_prefixes: must be non-empty strings")
    wildcards = [f"{p}+" for p in interface_prefixes]
    drop = f"{reason_comment(COMMENT_IPV6_NOT_POLICED)} -j DROP"
    input_rules = [icmpv6_accept("-i", w, t) for w in wildcards for t in ICMPV6_TO_HOST]
    input_rules += [f"-i {w} {drop}" for w in wildcards]
    forward = [f"-i {w} {drop}" for w in wildcards] + [f"-o {w} {drop}" for w in wildcards]
    output = [icmpv6_accept("-o", w, t) for w in wildcards for t in ICMPV6_FROM_HOST]
    output += [f"-o {w} {drop}" for w in wildcards]
    return [Chain(CHAIN_INPUT, tuple(input_rules)), Chain(CHAIN_FORWARD, tuple(forward)),
            Chain(CHAIN_OUTPUT, tuple(output))]


def ipv6_base_chain_inserts() -> dict[str, tuple[str, ...]]:
    """Our rules at the top of the kernel's own chains of the ip6tables filter table."""
    return {"INPUT": (f"-j {CHAIN_INPUT}",), "FORWARD": (f"-j {CHAIN_FORWARD}",),
            "OUTPUT": (f"-j {CHAIN_OUTPUT}",)}
