"""Host endpoint renderer: host endpoints, failsafes and the raw/mangle tables -> chains.

Role: Felix's host-endpoint half of the `rules` package. Pure functions; no kernel access.
Policy chains themselves come from `RuleRenderer` (a doNotTrack policy's chains live in the
raw table, a preDNAT policy's in mangle, every other policy's in filter).

Per host interface IF with a host endpoint (chain names in names.py; "*" = every host
interface, Felix's `any-interface-at-all`), by table:

    filter  cali-fh-IF  (arriving: ingress)   conntrack ESTABLISHED accept / INVALID drop,
            cali-th-IF  (leaving: egress)     -> cali-failsafe-in|out, clear marks, normal
                                              tiers -> profiles -> DROP (default deny)
            cali-fhfw-IF / cali-thfw-IF       applyOnForward tiers, only if there are any
                                              (forwarded traffic is otherwise not affected)
    mangle  cali-fh-IF  (preDNAT, ingress)    -> cali-failsafe-in, preDNAT tiers
    raw     cali-fh-IF / cali-th-IF           -> failsafes, doNotTrack tiers; an accepted
            (doNotTrack)                         packet is also `CT --notrack`ed

Static chains of the raw and mangle tables (filter's are `RuleRenderer.static_chains`):

    raw PREROUTING ─> cali-PREROUTING
        (iptables mode) -i cali+ -> cali-wl-src-dispatch   (workload source check, see
                                    render.py: a forged source DROPs here, before conntrack)
        clear marks; -i cali+ RETURN; -> cali-from-host-endpoint (-i IF goto cali-fh-IF);
        ACCEPT mark -> ACCEPT
    raw OUTPUT ─> cali-OUTPUT
        clear marks; -> cali-to-host-endpoint (-o IF goto cali-th-IF); ACCEPT mark -> ACCEPT
    mangle PREROUTING ─> cali-PREROUTING
        conntrack RELATED,ESTABLISHED -> ACCEPT; ACCEPT mark -> ACCEPT; -i cali+ RETURN;
        clear marks; -> cali-from-host-endpoint; ACCEPT mark -> ACCEPT

Pre-DNAT and doNotTrack chains have no end-of-tier drop, no profiles and no final drop: an
unmatched packet goes on to the normal policy in the filter table (Felix's semantics). An
allowed packet leaves them with the ACCEPT mark, which cali-PREROUTING (mangle/raw),
cali-INPUT and cali-OUTPUT turn into ACCEPT, skipping the filter-table host endpoint policy.

Failsafes (FailsafeInboundHostPorts / FailsafeOutboundHostPorts) are jumped to before any
policy of a host endpoint chain, in every table, so no host endpoint policy can block them:
`cali-failsafe-in` accepts inbound ports as destination; `cali-failsafe-out` outbound ports
as destination. In raw (no conntrack) each also accepts the other list's ports as SOURCE
(the replies of failsafe connections).

Dispatch chains (`cali-from-host-endpoint`, `cali-to-host-endpoint`, and in filter
`cali-from-hep-forward` / `cali-to-hep-forward`) send each interface to its chains; a
wildcard endpoint comes last; workload interfaces never reach host endpoint chains, and
a wildcard endpoint does not apply to loopback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pyfelix.agent.config import FAILSAFE_PROTOCOLS
from pyfelix.agent.config import parse_proto_ports as parse_failsafe_ports
from pyfelix.agent.dataplane.iptables.chains import Chain
from pyfelix.agent.dataplane.iptables.names import (
    CHAIN_FAILSAFE_IN,
    CHAIN_FAILSAFE_OUT,
    CHAIN_FROM_HEP_FORWARD_DISPATCH,
    CHAIN_FROM_HOST_DISPATCH,
    CHAIN_OUTPUT,
    CHAIN_PREROUTING,
    CHAIN_TO_HEP_FORWARD_DISPATCH,
    CHAIN_TO_HOST_DISPATCH,
    CHAIN_WL_SRC_DISPATCH,
    host_endpoint_chain_name,
)
from pyfelix.agent.dataplane.iptables.render import RuleRenderer, match_mark, set_mark
from pyfelix.agent.proto import HostEndpoint, PolicyID, TierInfo

FILTER, MANGLE, RAW = "filter", "mangle", "raw"
NOTRACK = "-j CT --notrack"

PortList = tuple[tuple[str, int], ...]
PolicyKnown = Callable[[PolicyID, str], bool]  # (policy, table it must be rendered in)


@dataclass(frozen=True)
class Failsafes:
    inbound: PortList = ()
    outbound: PortList = ()

    def __post_init__(self) -> None:
        for field, ports in (("FailsafeInboundHostPorts", self.inbound),
                             ("FailsafeOutboundHostPorts", self.outbound)):
            for proto, port in ports:
                if proto not in FAILSAFE_PROTOCOLS or not 0 < port < 65536:
                    raise ValueError(f"{field}: {proto}:{port} is not tcp|udp|sctp:1-65535")


def default_failsafes() -> Failsafes:
    """Felix's default FailsafeInboundHostPorts / FailsafeOutboundHostPorts."""
    from pyfelix.agent.config import DEFAULT_FAILSAFE_IN, DEFAULT_FAILSAFE_OUT

    return Failsafes(parse_failsafe_ports(DEFAULT_FAILSAFE_IN),
                     parse_failsafe_ports(DEFAULT_FAILSAFE_OUT))


def host_endpoint_policy_ids(endpoints: Iterable[HostEndpoint]) -> frozenset[PolicyID]:
    """Every policy a host endpoint lists, in any of its tier kinds and directions."""
    return frozenset(
        PolicyID(tier.name, name)
        for hep in endpoints
        for tiers in (hep.tiers, hep.untracked_tiers, hep.pre_dnat_tiers, hep.forward_tiers)
        for tier in tiers
        for name in (*tier.ingress_policies, *tier.egress_policies)
    )


def host_endpoint_profile_ids(endpoints: Iterable[HostEndpoint]) -> frozenset[str]:
    return frozenset(prof for hep in endpoints for prof in hep.profile_ids)


def _has(tiers: tuple[TierInfo, ...], inbound: bool) -> bool:
    return any(t.ingress_policies if inbound else t.egress_policies for t in tiers)


class HostEndpointRenderer:
    def __init__(self, rules: RuleRenderer) -> None:
        self.rules = rules
        self.marks = rules.marks

    # --- failsafes ---------------------------------------------------------------------------

    def failsafe_chains(self, failsafes: Failsafes, table: str) -> list[Chain]:
        def accept(ports: PortList, direction: str) -> list[str]:
            return [f"-p {proto} --{direction} {port} -j ACCEPT" for proto, port in ports]

        inbound = accept(failsafes.inbound, "dport")
        outbound = accept(failsafes.outbound, "dport")
        if table == RAW:  # no conntrack here: the replies must pass too
            inbound += accept(failsafes.outbound, "sport")
            outbound += accept(failsafes.inbound, "sport")
        chains = [Chain(CHAIN_FAILSAFE_IN, tuple(inbound))]
        if table != MANGLE:  # mangle PREROUTING sees only arriving packets
            chains.append(Chain(CHAIN_FAILSAFE_OUT, tuple(outbound)))
        return chains

    # --- one host endpoint -------------------------------------------------------------------

    def endpoint_chains(self, iface: str, hep: HostEndpoint, table: str, *,
                        policy_known: PolicyKnown,
                        profile_known: Callable[[str], bool]) -> list[Chain]:
        """The chains of `hep` on interface `iface` in `table` (none when nothing applies)."""
        if table == FILTER:
            chains = [self._filter_chain(iface, hep, inbound, policy_known, profile_known)
                      for inbound in (True, False)]
            for inbound in (True, False):
                if _has(hep.forward_tiers, inbound):
                    chains.append(self._forward_chain(iface, hep, inbound, policy_known))
            return chains
        tiers = hep.pre_dnat_tiers if table == MANGLE else hep.untracked_tiers
        directions = (True,) if table == MANGLE else (True, False)
        return [self._early_chain(iface, tiers, table, inbound, policy_known)
                for inbound in directions if _has(tiers, inbound)]

    def _known_in(self, table: str, policy_known: PolicyKnown) -> Callable[[PolicyID], bool]:
        return lambda pid: policy_known(pid, table)

    def _conntrack(self) -> list[str]:
        return ["-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-m conntrack --ctstate INVALID -j DROP"]

    def _filter_chain(self, iface: str, hep: HostEndpoint, inbound: bool,
                      policy_known: PolicyKnown, profile_known: Callable[[str], bool]) -> Chain:
        rules = [
            *self._conntrack(),
            f"-j {CHAIN_FAILSAFE_IN if inbound else CHAIN_FAILSAFE_OUT}",
            set_mark(0, self.marks.all),
            *self.rules.policy_section(f"host endpoint {iface}", hep.tiers, hep.profile_ids,
                                       inbound=inbound,
                                       policy_known=self._known_in(FILTER, policy_known),
                                       profile_known=profile_known),
        ]
        return Chain(host_endpoint_chain_name(iface, to_host_endpoint=not inbound),
                     tuple(rules))

    def _forward_chain(self, iface: str, hep: HostEndpoint, inbound: bool,
                       policy_known: PolicyKnown) -> Chain:
        rules = [
            *self._conntrack(),
            set_mark(0, self.marks.all),
            *self.rules.policy_section(f"host endpoint {iface} (forward)", hep.forward_tiers,
                                       (), inbound=inbound,
                                       policy_known=self._known_in(FILTER, policy_known),
                                       profile_known=lambda _: False, use_profiles=False,
                                       final_drop=False),
        ]
        return Chain(host_endpoint_chain_name(iface, to_host_endpoint=not inbound,
                                              forward=True), tuple(rules))

    def _early_chain(self, iface: str, tiers: tuple[TierInfo, ...], table: str, inbound: bool,
                     policy_known: PolicyKnown) -> Chain:
        what = "pre-DNAT" if table == MANGLE else "untracked"
        rules = [
            f"-j {CHAIN_FAILSAFE_IN if inbound else CHAIN_FAILSAFE_OUT}",
            set_mark(0, self.marks.all),
            *self.rules.policy_section(f"host endpoint {iface} ({what})", tiers, (),
                                       inbound=inbound,
                                       policy_known=self._known_in(table, policy_known),
                                       profile_known=lambda _: False,
                                       end_of_tier_drop=False, use_profiles=False,
                                       final_drop=False,
                                       on_accept=(NOTRACK,) if table == RAW else ()),
        ]
        return Chain(host_endpoint_chain_name(iface, to_host_endpoint=not inbound),
                     tuple(rules))

    # --- dispatch and static chains ----------------------------------------------------------

    def dispatch_chains(self, table: str, chains_by_iface: dict[str, Iterable[str]]
                        ) -> list[Chain]:
        """Dispatch chains of `table`, given each interface's host endpoint chain names."""
        def entries(flag: str, wanted: Callable[[str], bool]) -> list[str]:
            out = []
            for iface in sorted(chains_by_iface, key=lambda i: (i == "*", i)):
                for name in chains_by_iface[iface]:
                    if wanted(name):
                        out.append(f"-g {name}" if iface == "*" else f"{flag} {iface} -g {name}")
            return out

        def kind(name: str) -> str:
            return name.split("-")[1]

        # Workload interfaces are never host endpoints; nor is loopback for a "*" endpoint
        # (the host's own processes talk over it).
        skipped = [f"{p}+" for p in self.rules.interface_prefixes]
        if "*" in chains_by_iface:
            skipped.append("lo")
        skip_workloads_in = [f"-i {i} -j RETURN" for i in skipped]
        skip_workloads_out = [f"-o {i} -j RETURN" for i in skipped]
        chains = [
            Chain(CHAIN_FROM_HOST_DISPATCH,
                  tuple(skip_workloads_in + entries("-i", lambda n: kind(n) == "fh"))),
        ]
        if table != MANGLE:
            chains.append(Chain(CHAIN_TO_HOST_DISPATCH, tuple(
                skip_workloads_out + entries("-o", lambda n: kind(n) == "th"))))
        if table == FILTER:
            chains += [
                Chain(CHAIN_FROM_HEP_FORWARD_DISPATCH, tuple(
                    skip_workloads_in + entries("-i", lambda n: kind(n) == "fhfw"))),
                Chain(CHAIN_TO_HEP_FORWARD_DISPATCH, tuple(
                    skip_workloads_out + entries("-o", lambda n: kind(n) == "thfw"))),
            ]
        return chains

    def static_chains(self, table: str, *, source_check: bool = False) -> list[Chain]:
        """cali-PREROUTING (mangle, raw) and cali-OUTPUT (raw); filter's are RuleRenderer's.

        `source_check` (raw; iptables mode, where the per-endpoint source chains exist):
        packets from workload interfaces go through cali-wl-src-dispatch first."""
        m = self.marks
        accepted = f"{match_mark(m.accept, m.accept)} -j ACCEPT"
        workloads = [f"-i {p}+ -j RETURN" for p in self.rules.interface_prefixes]
        if table == MANGLE:
            return [Chain(CHAIN_PREROUTING, (
                "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT", accepted, *workloads,
                set_mark(0, m.all), f"-j {CHAIN_FROM_HOST_DISPATCH}", accepted))]
        if table == RAW:
            checks = [f"-i {p}+ -j {CHAIN_WL_SRC_DISPATCH}"
                      for p in self.rules.interface_prefixes] if source_check else []
            return [
                Chain(CHAIN_PREROUTING, (*checks, set_mark(0, m.all), *workloads,
                                         f"-j {CHAIN_FROM_HOST_DISPATCH}", accepted)),
                Chain(CHAIN_OUTPUT, (set_mark(0, m.all), f"-j {CHAIN_TO_HOST_DISPATCH}",
                                     accepted)),
            ]
        raise ValueError(f"no static host endpoint chains for table {table!r}")

    @staticmethod
    def base_chain_inserts(table: str) -> dict[str, tuple[str, ...]]:
        if table == MANGLE:
            return {"PREROUTING": (f"-j {CHAIN_PREROUTING}",)}
        if table == RAW:
            return {"PREROUTING": (f"-j {CHAIN_PREROUTING}",), "OUTPUT": (f"-j {CHAIN_OUTPUT}",)}
        raise ValueError(f"no host endpoint base-chain inserts for table {table!r}")
