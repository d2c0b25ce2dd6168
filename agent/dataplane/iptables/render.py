"""Policy renderer: calc-graph policy model -> iptables chains (filter table, IPv4), and the
workloads' source check (raw table, IPv4).

Role: Felix's `rules` package in Python. Pure functions of their inputs; no kernel access.
Host endpoint chains (and the raw/mangle tables' static chains) are in `hostendpoints.py`,
which reuses `policy_section()` from here; the IPv6 (ip6tables) chains are in `ipv6.py`.

Chains (all `cali-`; see names.py):

    FORWARD ─(our insert)─> cali-FORWARD
        clear our marks except ACCEPT (a pre-DNAT policy may have accepted in mangle)
        (not yet accepted) -> cali-from-hep-forward   (applyOnForward ingress of a host endpoint)
        -i cali+ -> cali-from-wl-dispatch ─(-i IF, goto)─> cali-fw-IF   (workload egress)
        -o cali+ -> cali-to-wl-dispatch   ─(-o IF, goto)─> cali-tw-IF   (workload ingress)
        -> cali-to-hep-forward                        (applyOnForward egress of a host endpoint)
        ACCEPT mark -> ACCEPT   (an allowed endpoint chain RETURNs with the ACCEPT mark set)
    INPUT ─(our insert)─> cali-INPUT
        -i cali+ goto cali-wl-to-host: egress policy of the sending workload, then
            DefaultEndpointToHostAction (Drop | Return | Accept; Return goes back to INPUT)
        ACCEPT mark -> ACCEPT (pre-DNAT / untracked policy accepted); clear marks;
        -> cali-from-host-endpoint (-i IF goto cali-fh-IF: host endpoint ingress); ACCEPT mark
    OUTPUT ─(our insert)─> cali-OUTPUT
        ACCEPT mark -> ACCEPT; -o cali+ RETURN (host to workload: no host endpoint policy);
        clear marks; -> cali-to-host-endpoint (-o IF goto cali-th-IF); ACCEPT mark -> ACCEPT
    With kube-ipvs0 present (kube-proxy IPVS), see `static_chains(ipvs=True)`.
    In BPF mode (tc programs police workloads) the three chains have no workload rules:
    `host_endpoint_only_chains()`.

Source check (raw table, iptables mode only; the BPF programs do their own RPF check):

    raw PREROUTING ─> cali-PREROUTING (hostendpoints.py)
        -i cali+ -> cali-wl-src-dispatch ─(-i IF, goto)─> cali-ws-IF
                                         no endpoint: DROP "pyfelix: no workload endpoint"
            cali-ws-IF:  -s <each IPv4 net of the endpoint> RETURN
                         -s <each IPv4 allowSpoofedSourcePrefixes entry> RETURN
                         DROP "pyfelix: spoofed source"
        (RETURN: on to the rest of cali-PREROUTING: doNotTrack / host endpoint rules)
    It runs before conntrack and routing, so a forged source never creates a conntrack entry
    nor reaches any policy. Strict rp_filter on workload interfaces (sysctls.py) stays as a
    second line, except where the endpoint allows spoofed IPv4 sources (there it would drop
    them, and this chain is the enforcement).

Endpoint chain (cali-tw-IF with ingress policies / inbound profile rules; cali-fw-IF with
egress / outbound):
    conntrack RELATED,ESTABLISHED -> ACCEPT;  INVALID -> DROP;  clear all our mark bits
    for each tier that has policies in this direction:
        clear PASS
        for each policy:  (PASS clear) -> jump cali-pi-/cali-po-<hash>;  ACCEPT mark -> RETURN
        unless the tier's default action is pass:  (PASS clear) -> DROP     (end of tier)
    for each profile (reached when no tier applied or every tier passed):
        jump cali-pri-/cali-pro-<hash>;  ACCEPT mark -> RETURN
    DROP

Policy/profile chain: each rule in order. Allow sets the ACCEPT mark and RETURNs; Deny DROPs;
Pass sets the PASS mark and RETURNs; Log LOGs and goes on. A rule whose matches fit one
iptables rule renders as one rule (+ the RETURN for allow/pass). Otherwise (several src or
dst nets, more than one negated net, ports AND named ports, more than 15 ports...) it is
evaluated with two scratch mark bits: M := base matches; each extra negated match clears M;
each "any of" clause sets T on any alternative and clears M if T stayed clear; then the
action applies to packets still carrying M, and M/T are cleared again.

Flow logs (`flow_logs=True`, FlowLogsFileEnabled): an NFLOG rule before each allow/deny
decision a new flow meets (rule Allow/Deny, end of tier, unknown policy, final DROP), its
group and prefix naming the rule; see `iptables/nflog.py`. Pass and Log rules log nothing.

Rule field semantics: see `agent.proto.Rule`. IPv6-only rules, ICMPv6 rules and rules whose
nets are all IPv6 cannot match in this IPv4 table and render as nothing (there is no IPv6
policy yet: ip6tables drops workload IPv6, see `ipv6.py`).

Bad input never crashes: a rule that cannot be rendered (ports without a port protocol,
ICMP code without type, port or ICMP values out of range, a net that does not parse, an
unknown action) is logged naming the policy, direction, rule index and field, and replaced
fail-closed: an invalid Allow or Log matches nothing; an invalid Deny or Pass drops.
An endpoint listing a policy that is not (yet) known drops at that point.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pyfelix.agent.dataplane.iptables import nflog
from pyfelix.agent.dataplane.iptables.chains import Chain
from pyfelix.agent.dataplane.iptables.names import (
    CHAIN_FORWARD,
    CHAIN_FROM_HEP_FORWARD_DISPATCH,
    CHAIN_FROM_HOST_DISPATCH,
    CHAIN_FROM_WL_DISPATCH,
    CHAIN_INPUT,
    CHAIN_OUTPUT,
    CHAIN_TO_HEP_FORWARD_DISPATCH,
    CHAIN_TO_HOST_DISPATCH,
    CHAIN_TO_WL_DISPATCH,
    CHAIN_WL_SRC_DISPATCH,
    CHAIN_WL_TO_HOST,
    COMMENT_SPOOFED_SOURCE,
    COMMENT_UNKNOWN_WORKLOAD,
    IPSET_ALL_HOSTS,
    IPSET_ALL_VXLAN,
    IPSET_THIS_HOST,
    IPSET_TYPE_IP_PORT,
    IPSET_TYPE_NET,
    endpoint_chain_name,
    ipset_name,
    ipset_name6,
    policy_chain_name,
    profile_chain_name,
    reason_comment,
    source_check_chain_name,
)
from pyfelix.agent.dataplane.iptables.nflog import nflog_rule
from pyfelix.agent.proto import Policy as ProtoPolicy
from pyfelix.agent.proto import PolicyID, PortRange, Profile, Rule, TierInfo, WorkloadEndpoint

log = logging.getLogger(__name__)

PROTOCOL_NAMES = {1: "icmp", 6: "tcp", 17: "udp", 58: "ipv6-icmp", 132: "sctp", 136: "udplite"}
PORT_PROTOCOLS = frozenset({6, 17, 132, 136})
ICMP = 1
ICMPV6 = 58
MULTIPORT_MAX = 15  # xt_multiport: 15 "ports", a range counting as two
LOG_PREFIX = "calico-packet: "

ENDPOINT_TO_HOST_ACTIONS = {"drop": "DROP", "return": "RETURN", "accept": "ACCEPT"}


def workload_tunnel_drops(vxlan_port: int | None, ipip: bool) -> tuple[str, ...]:
    """From-workload rules dropping VXLAN (UDP to `vxlan_port`, when given) and IPIP
    packets a pod sends: encapsulation would carry its traffic past its egress policy."""
    drops = []
    if vxlan_port is not None:
        drops.append(f"-p udp --dport {vxlan_port} -j DROP")
    if ipip:
        drops.append("-p 4 -j DROP")
    return tuple(drops)


def _tunnel_rules(vxlan_port: int | None, ipip: bool) -> tuple[list[str], list[str]]:
    """(cali-INPUT, cali-OUTPUT) rules that admit VXLAN only between known VTEPs and IPIP
    (IP protocol 4) only between known nodes (none without VXLAN / IPIP), as Felix's."""
    input_rules: list[str] = []
    output: list[str] = []
    if vxlan_port is not None:
        vxlan = f"-p udp --dport {vxlan_port}"
        input_rules += [f"{vxlan} -m set --match-set {IPSET_ALL_VXLAN} src -j ACCEPT",
                        f"{vxlan} -j DROP"]
        output.append(f"{vxlan} -m set --match-set {IPSET_ALL_VXLAN} dst -j ACCEPT")
    if ipip:
        input_rules += [f"-p 4 -m set --match-set {IPSET_ALL_HOSTS} src -j ACCEPT",
                        "-p 4 -j DROP"]
        output.append(f"-p 4 -m set --match-set {IPSET_ALL_HOSTS} dst -j ACCEPT")
    return input_rules, output


class RenderError(ValueError):
    """A rule that cannot be expressed; the message names the field."""


@dataclass(frozen=True)
class Marks:
    """Packet-mark bits the policy chains use (all within Felix's default 0xffff0000 mask)."""

    accept: int = 0x10000
    pass_: int = 0x20000
    scratch0: int = 0x40000
    scratch1: int = 0x80000
    # Set in INPUT on packets to a kube-proxy IPVS service address (not a host IP), so OUTPUT
    # can tell IPVS-forwarded packets from the host's own. Not part of `all`: endpoint
    # chains clear `all` and must keep it.
    ipvs_forward: int = 0x100000

    def __post_init__(self) -> None:
        bits = [self.accept, self.pass_, self.scratch0, self.scratch1, self.ipvs_forward]
        for bit in bits:
            if bit <= 0 or bit & (bit - 1) or bit > 0x80000000:
                raise ValueError(f"Marks: {bit:#x} is not a single 32-bit mark bit")
        if len(set(bits)) != len(bits):
            raise ValueError("Marks: the five mark bits must differ")

    @property
    def all(self) -> int:
        return self.accept | self.pass_ | self.scratch0 | self.scratch1


def match_mark(value: int, mask: int) -> str:
    return f"-m mark --mark {value:#x}/{mask:#x}"


def set_mark(value: int, mask: int) -> str:
    return f"-j MARK --set-xmark {value:#x}/{mask:#x}"


def _proto_name(number: int) -> str:
    return PROTOCOL_NAMES.get(number, str(number))


def _port_chunks(ranges: Iterable[PortRange], field: str) -> list[str]:
    chunks: list[str] = []
    current: list[str] = []
    weight = 0
    for r in ranges:
        if not (0 <= r.first <= r.last <= 65535):
            raise RenderError(f"{field}: port range {r.first}:{r.last} outside 0..65535")
        text, w = (str(r.first), 1) if r.first == r.last else (f"{r.first}:{r.last}", 2)
        if weight + w > MULTIPORT_MAX:
            chunks.append(",".join(current))
            current, weight = [], 0
        current.append(text)
        weight += w
    if current:
        chunks.append(",".join(current))
    return chunks


def _family_nets(nets: tuple[str, ...], field: str, family: int) -> list[str]:
    out = []
    for net in nets:
        try:
            parsed = ipaddress.ip_network(net, strict=False)
        except ValueError as exc:
            raise RenderError(f"{field}: {net!r} is not a CIDR") from exc
        if parsed.version == family:
            out.append(str(parsed))
    return out


def allowed_ipv4_sources(endpoint: WorkloadEndpoint) -> list[str]:
    return allowed_sources(endpoint, 4)


def allowed_sources(endpoint: WorkloadEndpoint, family: int) -> list[str]:
    """The sources of one family a workload may send from: its nets of that family, then
    the entries of that family in its allowSpoofedSourcePrefixes (normalised, duplicates
    dropped). An entry that does not parse is logged and left out (fail closed: its
    sources stay forbidden)."""
    out: list[str] = []
    own = endpoint.ipv4_nets if family == 4 else endpoint.ipv6_nets
    for field, nets in ((f"ipv{family}_nets", own),
                        ("allow_spoofed_source_prefixes", endpoint.allow_spoofed_source_prefixes)):
        for net in nets:
            try:
                parsed = ipaddress.ip_network(net, strict=False)
            except ValueError:
                log.error("workload endpoint %s: %s entry %r is not a CIDR; not allowed as a "
                          "source", endpoint.name, field, net)
                continue
            if parsed.version == family and str(parsed) not in out:
                out.append(str(parsed))
    return out


def _check_byte(value: int | None, field: str) -> None:
    if value is not None and not (0 <= value <= 255):
        raise RenderError(f"{field}: {value} outside 0..255")


class RuleRenderer:
    """Renders rules, policies, profiles and endpoints into `Chain`s for one IP family:
    `family=4` for iptables, `family=6` for ip6tables (rules of the other family render as
    nothing, IP sets are the family's twins `cali60*`, ICMP matches are ICMPv6's)."""

    def __init__(
        self,
        *,
        marks: Marks | None = None,
        interface_prefixes: tuple[str, ...] = ("cali",),
        endpoint_to_host_action: str = "Drop",
        ipset_namer: Callable[[str, str], str] | None = None,
        family: int = 4,
        flow_logs: bool = False,
    ) -> None:
        if family not in (4, 6):
            raise ValueError(f"family: {family!r} is not 4 or 6")
        self.family = family
        # FlowLogsFileEnabled: NFLOG rules before each decision (iptables/nflog.py)
        self.flow_logs = flow_logs
        if endpoint_to_host_action.lower() not in ENDPOINT_TO_HOST_ACTIONS:
            raise ValueError(
                f"DefaultEndpointToHostAction: {endpoint_to_host_action!r} is not one of "
                "Drop, Return, Accept"
            )
        if not interface_prefixes or not all(interface_prefixes):
            raise ValueError("interface_prefixes: must be non-empty strings")
        self.marks = marks or Marks()
        self.interface_prefixes = interface_prefixes
        self.endpoint_to_host_action = endpoint_to_host_action
        self._ipset_name = ipset_namer or (ipset_name if family == 4 else ipset_name6)
        # rules at the top of every from-workload chain dropping tunnel packets a pod sends
        # (Felix's "Drop VXLAN/IPinIP encapped packets originating in workloads"); the
        # manager sets them while VXLAN / IPIP is in use (`workload_tunnel_drops`)
        self.workload_tunnel_drops: tuple[str, ...] = ()

    # --- one rule ----------------------------------------------------------------------------

    def render_rule(self, rule: Rule, log_prefix: str | None = None) -> list[str]:
        """One proto rule -> iptables rule fragments (raises RenderError on bad input).
        `log_prefix`: with flow logs on, the NFLOG prefix of an allow or deny."""
        if rule.action not in ("allow", "deny", "pass", "log"):
            raise RenderError(f"action: {rule.action!r} is not allow, deny, pass or log")
        if rule.ip_version not in (None, 4, 6):
            raise RenderError(f"ip_version: {rule.ip_version!r} is not 4 or 6")
        _check_byte(rule.protocol, "protocol")
        _check_byte(rule.not_protocol, "not_protocol")
        for name in ("icmp_type", "icmp_code", "not_icmp_type", "not_icmp_code"):
            _check_byte(getattr(rule, name), name)
        family = self.family
        icmp = ICMP if family == 4 else ICMPV6
        if (rule.ip_version not in (None, family)
                or rule.protocol == (ICMPV6 if family == 4 else ICMP)):
            return []  # cannot match packets of this family
        src = _family_nets(rule.src_nets, "src_nets", family)
        dst = _family_nets(rule.dst_nets, "dst_nets", family)
        if (rule.src_nets and not src) or (rule.dst_nets and not dst):
            return []  # nets of the other family only: nothing in this table can match
        not_src = _family_nets(rule.not_src_nets, "not_src_nets", family)
        not_dst = _family_nets(rule.not_dst_nets, "not_dst_nets", family)

        numeric_ports = (rule.src_ports or rule.dst_ports or rule.not_src_ports
                         or rule.not_dst_ports)
        if numeric_ports and rule.protocol not in PORT_PROTOCOLS:
            raise RenderError(
                "ports: need protocol tcp, udp, sctp or udplite "
                f"(protocol is {rule.protocol!r})"
            )
        has_icmp = any(v is not None for v in (rule.icmp_type, rule.icmp_code,
                                                rule.not_icmp_type, rule.not_icmp_code))
        if has_icmp and rule.protocol != icmp:
            raise RenderError(f"icmp_type/icmp_code: need protocol {_proto_name(icmp)} "
                              f"({icmp}), not {rule.protocol}")
        if rule.icmp_code is not None and rule.icmp_type is None:
            raise RenderError("icmp_code: given without icmp_type")
        if rule.not_icmp_code is not None and rule.not_icmp_type is None:
            raise RenderError("not_icmp_code: given without not_icmp_type")

        proto = f"-p {_proto_name(rule.protocol)}" if rule.protocol is not None else ""
        base: list[str] = []  # all must match, fit in one rule
        clear_if: list[str] = []  # extra negations: a match here means "no match"
        any_of: list[list[str]] = []  # clauses: at least one alternative must match
        if rule.not_protocol is not None:
            base.append(f"! -p {_proto_name(rule.not_protocol)}")

        for flag, pos, neg in (("-s", src, not_src), ("-d", dst, not_dst)):
            inline_used = False
            if len(pos) == 1:
                base.append(f"{flag} {pos[0]}")
                inline_used = True
            elif len(pos) > 1:
                any_of.append([f"{flag} {net}" for net in pos])
            for net in neg:
                if not inline_used:
                    base.append(f"! {flag} {net}")
                    inline_used = True
                else:
                    clear_if.append(f"{flag} {net}")

        for ids, direction in ((rule.src_ip_set_ids, "src"), (rule.dst_ip_set_ids, "dst")):
            for set_id in ids:
                base.append(f"-m set --match-set {self._ipset_name(set_id, IPSET_TYPE_NET)} "
                            f"{direction}")
        for ids, direction in ((rule.not_src_ip_set_ids, "src"),
                               (rule.not_dst_ip_set_ids, "dst")):
            for set_id in ids:
                base.append(f"-m set ! --match-set {self._ipset_name(set_id, IPSET_TYPE_NET)} "
                            f"{direction}")

        for side, ports, named, not_ports, not_named in (
            ("s", rule.src_ports, rule.src_named_port_ip_set_ids,
             rule.not_src_ports, rule.not_src_named_port_ip_set_ids),
            ("d", rule.dst_ports, rule.dst_named_port_ip_set_ids,
             rule.not_dst_ports, rule.not_dst_named_port_ip_set_ids),
        ):
            flag = f"--{side}ports"
            sets_dir = "src,src" if side == "s" else "dst,dst"
            field = "src_ports" if side == "s" else "dst_ports"
            alternatives = [f"-m multiport {flag} {c}" for c in _port_chunks(ports, field)]
            alternatives += [
                f"-m set --match-set {self._ipset_name(i, IPSET_TYPE_IP_PORT)} {sets_dir}"
                for i in named
            ]
            if len(alternatives) == 1:
                base.append(alternatives[0])
            elif alternatives:
                any_of.append(alternatives)
            base += [f"-m multiport ! {flag} {c}" for c in _port_chunks(not_ports, "not_" + field)]
            base += [
                f"-m set ! --match-set {self._ipset_name(i, IPSET_TYPE_IP_PORT)} {sets_dir}"
                for i in not_named
            ]

        icmp_match = "-m icmp --icmp-type" if family == 4 else "-m icmp6 --icmpv6-type"
        icmp_not = ("-m icmp ! --icmp-type" if family == 4 else "-m icmp6 ! --icmpv6-type")
        if rule.icmp_type is not None:
            code = f"/{rule.icmp_code}" if rule.icmp_code is not None else ""
            base.append(f"{icmp_match} {rule.icmp_type}{code}")
        if rule.not_icmp_type is not None:
            code = f"/{rule.not_icmp_code}" if rule.not_icmp_code is not None else ""
            if rule.icmp_type is None:
                base.append(f"{icmp_not} {rule.not_icmp_type}{code}")
            else:
                clear_if.append(f"{icmp_match} {rule.not_icmp_type}{code}")

        return self._assemble(rule.action, proto, base, clear_if, any_of, log_prefix)

    def _assemble(
        self, action: str, proto: str, base: list[str], clear_if: list[str],
        any_of: list[list[str]], log_prefix: str | None = None,
    ) -> list[str]:
        m = self.marks
        log_allow: list[str] = []
        log_deny: list[str] = []
        if log_prefix is not None and action == "allow":
            log_allow = [nflog_rule(match_mark(m.accept, m.accept), action, log_prefix)]

        def join(*parts: str) -> str:
            return " ".join(p for p in parts if p)

        matches = join(proto, *base)
        if not clear_if and not any_of:
            if action == "allow":
                return [join(matches, set_mark(m.accept, m.accept)), *log_allow,
                        join(match_mark(m.accept, m.accept), "-j RETURN")]
            if action == "pass":
                return [join(matches, set_mark(m.pass_, m.pass_)),
                        join(match_mark(m.pass_, m.pass_), "-j RETURN")]
            if action == "deny":
                if log_prefix is not None:
                    log_deny = [nflog_rule(matches, action, log_prefix)]
                return [*log_deny, join(matches, "-j DROP")]
            return [join(matches, f'-j LOG --log-prefix "{LOG_PREFIX}" --log-level 5')]

        s0, s1 = m.scratch0, m.scratch1
        out = [join(matches, set_mark(s0, s0))]
        for atom in clear_if:
            out.append(join(match_mark(s0, s0), proto, atom, set_mark(0, s0)))
        for clause in any_of:
            for alt in clause:
                out.append(join(match_mark(s0, s0), proto, alt, set_mark(s1, s1)))
            out.append(join(match_mark(s0, s0 | s1), set_mark(0, s0)))
            out.append(set_mark(0, s1))
        if action == "allow":
            out += [join(match_mark(s0, s0), set_mark(m.accept, m.accept | s0)), *log_allow,
                    join(match_mark(m.accept, m.accept), "-j RETURN")]
        elif action == "pass":
            out += [join(match_mark(s0, s0), set_mark(m.pass_, m.pass_ | s0)),
                    join(match_mark(m.pass_, m.pass_), "-j RETURN")]
        elif action == "deny":
            if log_prefix is not None:
                out.append(nflog_rule(match_mark(s0, s0), action, log_prefix))
            out.append(join(match_mark(s0, s0), "-j DROP"))
        else:
            out += [join(match_mark(s0, s0),
                         f'-j LOG --log-prefix "{LOG_PREFIX}" --log-level 5'),
                    set_mark(0, s0)]
        return out

    def render_rules(self, rules: tuple[Rule, ...], owner: str,
                     log_as: tuple[str, str, str, bool] | None = None) -> list[str]:
        """Every rule of a policy/profile direction; bad rules replaced fail-closed.
        `log_as` = (kind, tier, name, inbound) names the rules in NFLOG prefixes when flow
        logs are on."""
        out: list[str] = []
        for index, rule in enumerate(rules):
            log_prefix = None
            if self.flow_logs and log_as is not None and rule.action in ("allow", "deny"):
                kind, tier, name, inbound = log_as
                log_prefix = nflog.prefix(rule.action, inbound, kind, index, tier, name)
            try:
                out += self.render_rule(rule, log_prefix)
            except RenderError as exc:
                log.error("%s rule %d: %s; rendered fail-closed", owner, index, exc)
                if rule.action not in ("allow", "log"):
                    if self.flow_logs and log_as is not None:
                        kind, tier, name, inbound = log_as
                        out.append(nflog_rule("", "deny", nflog.prefix(
                            "deny", inbound, kind, index, tier, name)))
                    out.append("-j DROP")
        return out

    # --- policies and profiles ---------------------------------------------------------------

    def policy_chains(self, policy_id: PolicyID, policy: ProtoPolicy) -> list[Chain]:
        owner = f"policy {policy_id.tier}/{policy_id.name}"
        return [
            Chain(policy_chain_name(policy_id.tier, policy_id.name, inbound=True),
                  tuple(self.render_rules(policy.inbound_rules, owner + " inbound",
                                          ("policy", policy_id.tier, policy_id.name, True)))),
            Chain(policy_chain_name(policy_id.tier, policy_id.name, inbound=False),
                  tuple(self.render_rules(policy.outbound_rules, owner + " outbound",
                                          ("policy", policy_id.tier, policy_id.name, False)))),
        ]

    def profile_chains(self, profile_id: str, profile: Profile) -> list[Chain]:
        owner = f"profile {profile_id}"
        return [
            Chain(profile_chain_name(profile_id, inbound=True),
                  tuple(self.render_rules(profile.inbound_rules, owner + " inbound",
                                          ("profile", "", profile_id, True)))),
            Chain(profile_chain_name(profile_id, inbound=False),
                  tuple(self.render_rules(profile.outbound_rules, owner + " outbound",
                                          ("profile", "", profile_id, False)))),
        ]

    # --- endpoints -----------------------------------------------------------------------------

    def endpoint_chains(
        self,
        endpoint: WorkloadEndpoint,
        *,
        policy_known: Callable[[PolicyID], bool],
        profile_known: Callable[[str], bool],
    ) -> list[Chain]:
        """cali-tw-IF and cali-fw-IF; for IPv6 also the source check cali-ws-IF, which
        cali-fw-IF jumps to first (IPv4 checks sources in the raw table instead)."""
        from_workload = self._endpoint_rules(endpoint, False, policy_known, profile_known)
        chains = [Chain(endpoint_chain_name(endpoint.name, to_workload=True),
                        tuple(self._endpoint_rules(endpoint, True, policy_known,
                                                   profile_known)))]
        if self.family == 6:
            check = self.source_check_chain(endpoint, family=6)
            from_workload = [f"-j {check.name}", *from_workload]
            chains.append(check)
        chains.insert(1, Chain(endpoint_chain_name(endpoint.name, to_workload=False),
                               tuple(from_workload)))
        return chains

    def _endpoint_rules(
        self,
        endpoint: WorkloadEndpoint,
        to_workload: bool,
        policy_known: Callable[[PolicyID], bool],
        profile_known: Callable[[str], bool],
    ) -> list[str]:
        if endpoint.state != "active":
            return ["-j DROP"]
        return [
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            "-m conntrack --ctstate INVALID -j DROP",
            set_mark(0, self.marks.all),
            *(() if to_workload else self.workload_tunnel_drops),
            *self.policy_section(endpoint.name, endpoint.tiers, endpoint.profile_ids,
                                 inbound=to_workload, policy_known=policy_known,
                                 profile_known=profile_known),
        ]

    def policy_section(
        self,
        owner: str,
        tiers: tuple[TierInfo, ...],
        profile_ids: tuple[str, ...],
        *,
        inbound: bool,
        policy_known: Callable[[PolicyID], bool],
        profile_known: Callable[[str], bool],
        end_of_tier_drop: bool = True,
        use_profiles: bool = True,
        final_drop: bool = True,
        on_accept: tuple[str, ...] = (),
    ) -> list[str]:
        """The tiers -> profiles -> DROP part of an endpoint chain (see the module docstring).

        Untracked and pre-DNAT chains pass `end_of_tier_drop=False, use_profiles=False,
        final_drop=False` (normal policy still follows in the filter table); `on_accept` are
        extra actions for accepted packets before their RETURN (raw: `-j CT --notrack`)."""
        m = self.marks
        accepted = [f"{match_mark(m.accept, m.accept)} {action}" for action in on_accept]
        accepted.append(f"{match_mark(m.accept, m.accept)} -j RETURN")
        rules: list[str] = []
        for tier in tiers:
            names = tier.ingress_policies if inbound else tier.egress_policies
            if not names:
                continue
            rules.append(set_mark(0, m.pass_))
            for name in names:
                pid = PolicyID(tier.name, name)
                if not policy_known(pid):
                    log.error("endpoint %s: policy %s/%s unknown; dropping at its place",
                              owner, tier.name, name)
                    if self.flow_logs:
                        rules.append(nflog_rule(match_mark(0, m.pass_), "deny", nflog.prefix(
                            "deny", inbound, "policy", -1, tier.name, name)))
                    rules.append(f"{match_mark(0, m.pass_)} -j DROP")
                    continue
                chain = policy_chain_name(tier.name, name, inbound=inbound)
                rules.append(f"{match_mark(0, m.pass_)} -j {chain}")
                rules += accepted
            if end_of_tier_drop and tier.default_action != "pass":
                if self.flow_logs:
                    rules.append(nflog_rule(match_mark(0, m.pass_), "deny", nflog.prefix(
                        "deny", inbound, "tier-end", tier=tier.name)))
                rules.append(f"{match_mark(0, m.pass_)} -j DROP")
        if use_profiles:
            for profile_id in profile_ids:
                if not profile_known(profile_id):
                    log.warning("endpoint %s: profile %s unknown; skipped", owner, profile_id)
                    continue
                rules.append(f"-j {profile_chain_name(profile_id, inbound=inbound)}")
                rules += accepted
        if final_drop:
            if self.flow_logs:
                rules.append(nflog_rule("", "deny", nflog.prefix("deny", inbound,
                                                                "default-deny")))
            rules.append("-j DROP")
        return rules

    def dispatch_chains(self, ifaces: Iterable[str]) -> list[Chain]:
        names = sorted(set(ifaces))
        return [
            Chain(CHAIN_FROM_WL_DISPATCH, tuple(
                [f"-i {i} -g {endpoint_chain_name(i, to_workload=False)}" for i in names]
                + ["-j DROP"])),
            Chain(CHAIN_TO_WL_DISPATCH, tuple(
                [f"-o {i} -g {endpoint_chain_name(i, to_workload=True)}" for i in names]
                + ["-j DROP"])),
        ]

    # --- source check (raw table) -----------------------------------------------------------

    @staticmethod
    def source_check_chain(endpoint: WorkloadEndpoint, family: int = 4) -> Chain:
        """cali-ws-IF: RETURN for the sources the endpoint may use, DROP (commented) else."""
        rules = [f"-s {net} -j RETURN" for net in allowed_sources(endpoint, family)]
        rules.append(f"{reason_comment(COMMENT_SPOOFED_SOURCE)} -j DROP")
        return Chain(source_check_chain_name(endpoint.name), tuple(rules))

    @staticmethod
    def source_dispatch_chain(ifaces: Iterable[str]) -> Chain:
        """cali-wl-src-dispatch: each workload interface to its cali-ws-IF; a workload
        interface without an endpoint drops (commented)."""
        rules = [f"-i {i} -g {source_check_chain_name(i)}" for i in sorted(set(ifaces))]
        rules.append(f"{reason_comment(COMMENT_UNKNOWN_WORKLOAD)} -j DROP")
        return Chain(CHAIN_WL_SRC_DISPATCH, tuple(rules))

    def static_chains(self, *, ipvs: bool = False, vxlan_port: int | None = None,
                      ipip: bool = False, workload_policy: bool = True) -> list[Chain]:
        """cali-FORWARD, cali-INPUT, cali-wl-to-host and cali-OUTPUT (filter table).

        `workload_policy=False` (BPF mode: the tc programs police workloads) renders the
        host-endpoint-only variant, see `host_endpoint_only_chains`.

        `vxlan_port` (VXLAN tunnel endpoints exist): VXLAN packets from other nodes
        (`cali40all-vxlan-net`: their VTEPs' parent IPs) are accepted first thing in
        cali-INPUT, and others to that port dropped; VXLAN packets to those nodes are
        accepted first thing in cali-OUTPUT - so no host endpoint policy can cut the
        overlay (Felix's rules). `ipip` (IPIP tunnels exist): the same for IPIP packets
        (IP protocol 4) and the nodes' host IPs (`cali40all-hosts-net`).

        `ipvs` (kube-proxy's `kube-ipvs0` exists): a packet to an address that is not one of
        this host's (`cali40this-host`, which leaves kube-ipvs0's service addresses out) is
        IPVS traffic on its way to a pod: a workload sending it gets its egress policy but
        not DefaultEndpointToHostAction, and OUTPUT applies the ingress policy of the pod it
        is forwarded to (the packet carries `marks.ipvs_forward` from INPUT). Forwarded to
        anywhere else it keeps the ACCEPT mark its egress policy gave it, so host endpoint
        egress policy does not apply to it (it is not the host's own traffic)."""
        if not workload_policy:
            if ipvs:
                raise ValueError("static_chains: the IPVS rules need workload policy chains")
            return self.host_endpoint_only_chains(vxlan_port=vxlan_port, ipip=ipip)
        m = self.marks
        wildcards = [f"{p}+" for p in self.interface_prefixes]
        accepted = f"{match_mark(m.accept, m.accept)} -j ACCEPT"
        forward = (
            [set_mark(0, m.all & ~m.accept),
             f"{match_mark(0, m.accept)} -j {CHAIN_FROM_HEP_FORWARD_DISPATCH}"]
            + [f"-i {w} -j {CHAIN_FROM_WL_DISPATCH}" for w in wildcards]
            + [f"-o {w} -j {CHAIN_TO_WL_DISPATCH}" for w in wildcards]
            + [f"-j {CHAIN_TO_HEP_FORWARD_DISPATCH}", accepted]
        )
        not_host = f"-m set ! --match-set {IPSET_THIS_HOST} dst"
        input_rules, output = _tunnel_rules(vxlan_port, ipip)
        if ipvs:
            input_rules.append(f"{not_host} {set_mark(m.ipvs_forward, m.ipvs_forward)}")
        input_rules += [f"-i {w} -g {CHAIN_WL_TO_HOST}" for w in wildcards]
        input_rules += [accepted, set_mark(0, m.all), f"-j {CHAIN_FROM_HOST_DISPATCH}", accepted]
        to_host = ENDPOINT_TO_HOST_ACTIONS[self.endpoint_to_host_action.lower()]
        wl_to_host = [f"-j {CHAIN_FROM_WL_DISPATCH}"]
        if ipvs:
            wl_to_host.append(f"{not_host} -j ACCEPT")
        wl_to_host.append(f"-j {to_host}")
        if ipvs:  # before the ACCEPT-mark check: the sender's egress policy set that mark
            output += [f"{match_mark(m.ipvs_forward, m.ipvs_forward)} -o {w} "
                       f"-g {CHAIN_TO_WL_DISPATCH}" for w in wildcards]
        output.append(accepted)
        output += [f"-o {w} -j RETURN" for w in wildcards]
        output += [set_mark(0, m.all), f"-j {CHAIN_TO_HOST_DISPATCH}", accepted]
        return [
            Chain(CHAIN_FORWARD, tuple(forward)),
            Chain(CHAIN_INPUT, tuple(input_rules)),
            Chain(CHAIN_WL_TO_HOST, tuple(wl_to_host)),
            Chain(CHAIN_OUTPUT, tuple(output)),
        ]

    def host_endpoint_only_chains(self, *, vxlan_port: int | None = None,
                                  ipip: bool = False) -> list[Chain]:
        """cali-FORWARD, cali-INPUT and cali-OUTPUT when BPF programs police the workloads.

        Nothing here filters workload traffic: no workload dispatch chains, no endpoint
        chains, no cali-wl-to-host. cali-FORWARD keeps only the applyOnForward host endpoint
        dispatch (whose chains RETURN at once for workload interfaces, so pod-to-pod traffic
        passes through untouched and goes on to FORWARD's own rules; a pod's traffic leaving
        through a host endpoint with applyOnForward policy gets that policy, as in Felix).
        cali-INPUT hands workload-to-host packets back without judging them: the tc program
        already applied the pod's egress policy and DefaultEndpointToHostAction (it drops on
        Drop); `-j ACCEPT` for Accept (as the iptables dataplane's cali-INPUT does, so the
        host's own INPUT rules do not see them), `-j RETURN` otherwise. Host endpoint
        policy, failsafes and the VXLAN / IPIP rules are as in `static_chains`."""
        m = self.marks
        wildcards = [f"{p}+" for p in self.interface_prefixes]
        accepted = f"{match_mark(m.accept, m.accept)} -j ACCEPT"
        forward = [set_mark(0, m.all & ~m.accept),
                   f"{match_mark(0, m.accept)} -j {CHAIN_FROM_HEP_FORWARD_DISPATCH}",
                   f"-j {CHAIN_TO_HEP_FORWARD_DISPATCH}", accepted]
        input_rules, output = _tunnel_rules(vxlan_port, ipip)
        to_host = "ACCEPT" if self.endpoint_to_host_action.lower() == "accept" else "RETURN"
        input_rules += [f"-i {w} -j {to_host}" for w in wildcards]
        input_rules += [accepted, set_mark(0, m.all), f"-j {CHAIN_FROM_HOST_DISPATCH}", accepted]
        output.append(accepted)
        output += [f"-o {w} -j RETURN" for w in wildcards]
        output += [set_mark(0, m.all), f"-j {CHAIN_TO_HOST_DISPATCH}", accepted]
        return [Chain(CHAIN_FORWARD, tuple(forward)), Chain(CHAIN_INPUT, tuple(input_rules)),
                Chain(CHAIN_OUTPUT, tuple(output))]

    @staticmethod
    def base_chain_inserts() -> dict[str, tuple[str, ...]]:
        """Our rules at the top of the kernel's own chains."""
        return {"FORWARD": (f"-j {CHAIN_FORWARD}",), "INPUT": (f"-j {CHAIN_INPUT}",),
                "OUTPUT": (f"-j {CHAIN_OUTPUT}",)}
