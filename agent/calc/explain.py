"""The calc graph's half of `pyfelix explain`: why a node gives a new flow its verdict.

Role: pure logic over what the calc graph computed for a node (`ExpectedDataplane`: the local
endpoints with their ordered tiers and profiles, the active policies' resolved rules, the IP
sets' members) plus two things the graph already knows and this module reads: each IP set's
selector (`RuleScanner.ip_set_specs()`), and where every workload endpoint of the cluster is
(`EndpointDirectory`, a calc node fed by the same dispatcher). No I/O except `compute_model`,
which runs the pipeline over a datastore as `pyfelix calc` does.

Inputs: a `Flow` (addresses, protocol, ports or ICMP type/code) and the endpoint and direction
to judge (the POD's ingress: packets to it; egress: packets from it).
Outputs: `DirectionVerdict`: the verdict, the deciding tier / policy / rule (or the tier's
end-of-tier deny, or the final deny), every rule considered in order with why it did or did
not match, and every IP set looked up with the answer (selector shown, not the id).

Semantics (identical in every dataplane, `proto.Rule`): tiers in order; in a tier, policies
in order and in a policy rules in order; the first matching allow/deny decides, pass ends
the tier, log continues; a tier whose policies (for this direction) match nothing denies
unless its default action is pass; then the profiles (pass ends a profile); then deny. IPv4
only: rules with ipVersion 6 never match an IPv4 flow.

The BPF dataplane's counter names for the deciding record are `counter_name`: the rule's
`rule_id`, `tier-end:<tier>/<direction>` or `default-deny/<direction>` (agent.bpf.compiler),
so `pyfelix explain` can check the kernel's decision against this one record for record.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyfelix.agent import proto
from pyfelix.agent.calc.dispatcher import KIND_WORKLOAD_ENDPOINT, CalcUpdate, Dispatcher

if TYPE_CHECKING:
    from pyfelix.agent.calc.expected_dataplane import ExpectedDataplane
    from pyfelix.agent.calc.rule_scanner import IPSetSpec
    from pyfelix.agent.datastore import DatastoreLocation

INGRESS = "ingress"
EGRESS = "egress"
PORT_PROTOCOLS = (6, 17, 132)
PROTOCOL_NAMES = {1: "icmp", 6: "tcp", 17: "udp", 132: "sctp", 58: "icmpv6", 136: "udplite"}


class ExplainError(ValueError):
    """The question cannot be answered (unknown pod, no address, ...); the message says why."""


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    protocol: int  # IP protocol number
    sport: int = 0
    dport: int = 0
    icmp_type: int = 8  # echo request
    icmp_code: int = 0

    @property
    def has_ports(self) -> bool:
        return self.protocol in PORT_PROTOCOLS

    def describe(self) -> str:
        name = PROTOCOL_NAMES.get(self.protocol, str(self.protocol))
        if self.has_ports:
            return f"{self.src}:{self.sport} -> {self.dst}:{self.dport} {name}"
        if self.protocol == 1:
            return f"{self.src} -> {self.dst} icmp type {self.icmp_type} code {self.icmp_code}"
        return f"{self.src} -> {self.dst} {name}"


# --- where the endpoints are ---------------------------------------------------------------


@dataclass(frozen=True)
class EndpointRecord:
    name: str  # "<namespace>/<pod>"
    node: str
    interface: str
    ipv4: tuple[str, ...]  # addresses (no prefix length)
    endpoint_id: proto.WorkloadEndpointID


class EndpointDirectory:
    """Calc node: every workload endpoint of the cluster by `<namespace>/<pod>`, with its node,
    interface and IPv4 addresses (the local endpoint filter only keeps this node's)."""

    def __init__(self) -> None:
        self._by_name: dict[str, EndpointRecord] = {}
        self._name_of_key: dict[Any, str] = {}

    def register_with(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(KIND_WORKLOAD_ENDPOINT, self.on_update)

    def on_update(self, update: CalcUpdate) -> None:
        old = self._name_of_key.pop(update.key, None)
        if old is not None:
            self._by_name.pop(old, None)
        wep = update.value
        if wep is None:
            return
        name = wep.endpoint_id
        ipv4 = tuple(str(ipaddress.ip_interface(n).ip) for n in wep.ip_networks
                     if ipaddress.ip_interface(n).version == 4)
        self._by_name[name] = EndpointRecord(
            name, wep.node, wep.interface_name, ipv4,
            proto.WorkloadEndpointID(wep.orchestrator, name, wep.endpoint))
        self._name_of_key[update.key] = name

    def get(self, name: str) -> EndpointRecord | None:
        return self._by_name.get(name)

    def by_address(self, address: str) -> EndpointRecord | None:
        for record in self._by_name.values():
            if address in record.ipv4:
                return record
        return None


# --- the model -------------------------------------------------------------------------------


@dataclass
class ExplainModel:
    """What explain reasons over, for one node."""

    hostname: str
    state: ExpectedDataplane
    specs: dict[str, IPSetSpec]
    directory: EndpointDirectory
    warnings: list[str] = field(default_factory=list)

    def resolve(self, text: str) -> tuple[str, EndpointRecord | None]:
        """`NS/POD` or an IPv4 address -> (address, the endpoint or None)."""
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            record = self.directory.get(text)
            if record is None:
                raise ExplainError(f"no workload endpoint {text!r} in the datastore (give "
                                   f"NAMESPACE/POD or an IPv4 address)") from None
            if not record.ipv4:
                raise ExplainError(f"workload endpoint {text!r} has no IPv4 address") from None
            return record.ipv4[0], record
        if address.version != 4:
            raise ExplainError(f"{text}: only IPv4 flows can be explained")
        return str(address), self.directory.by_address(str(address))

    def local_endpoint(self, record: EndpointRecord | None) -> proto.WorkloadEndpoint | None:
        if record is None or record.node != self.hostname:
            return None
        return self.state.workload_endpoints.get(record.endpoint_id)


def compute_model(datastore: DatastoreLocation, hostname: str, *,
                  timeout: float = 30.0) -> ExplainModel:
    """Run the calc pipeline over `datastore` for `hostname` (as `pyfelix calc` does) and
    keep what explain needs. Raises as `agent.calc.snapshot.compute`."""
    from pyfelix.agent.calc.snapshot import compute

    directory = EndpointDirectory()
    graphs: list[Any] = []

    def wire(pipeline: Any) -> None:
        directory.register_with(pipeline.graph.all_updates)
        graphs.append(pipeline.graph)

    snapshot = compute(datastore, hostname, timeout=timeout, before_feed=wire)
    specs = graphs[0].rule_scanner.ip_set_specs()
    return ExplainModel(hostname, snapshot.state, specs, directory, snapshot.warnings)


# --- one direction ---------------------------------------------------------------------------


@dataclass
class RuleStep:
    """One rule considered: where it is, what it says, whether it matched and why."""

    kind: str  # "policy" | "profile"
    tier: str  # "" for profiles
    owner: str  # policy name or profile id
    index: int
    action: str
    text: str
    matched: bool
    why: str
    rule_id: str
    lookups: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tier": self.tier or None, "policy": self.owner,
                "rule": self.index, "action": self.action, "text": self.text,
                "matched": self.matched, "why": self.why, "ip_sets": self.lookups}


@dataclass
class DirectionVerdict:
    direction: str
    endpoint: str
    verdict: str  # "allow" | "deny"
    decided_by: str  # "rule" | "tier-end" | "default-deny"
    tier: str | None
    policy: str | None
    rule: int | None
    rule_text: str | None
    counter_name: str
    steps: list[RuleStep]
    tiers: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return {"direction": self.direction, "endpoint": self.endpoint, "verdict": self.verdict,
                "decided_by": self.decided_by, "tier": self.tier, "policy": self.policy,
                "rule": self.rule, "rule_text": self.rule_text,
                "tiers": self.tiers, "steps": [s.as_dict() for s in self.steps]}


class _Matcher:
    def __init__(self, model: ExplainModel, flow: Flow) -> None:
        self.model = model
        self.flow = flow

    def _set_label(self, set_id: str) -> str:
        spec = self.model.specs.get(set_id)
        if spec is None:
            return set_id
        text = spec.selector.canonical
        if spec.named_port is not None:
            return f"{text} port {spec.named_port.protocol_name}:{spec.named_port.name}"
        return text

    def in_set(self, set_id: str, addr: str, lookups: list[dict[str, Any]], *,
               port: int | None = None) -> bool:
        members = self.model.state.ip_sets.get(set_id, set())
        a = ipaddress.ip_address(addr)
        hit = False
        for member in members:
            net_text, _, port_text = member.partition(",")
            net = ipaddress.ip_network(net_text, strict=False)
            if net.version != 4 or a not in net:
                continue
            if port is None:
                hit = True
                break
            proto_name, _, number = port_text.partition(":")
            if (PROTOCOL_NAMES.get(self.flow.protocol) == proto_name.lower()
                    and number.isdigit() and int(number) == port):
                hit = True
                break
        lookup: dict[str, Any] = {"id": set_id, "selector": self._set_label(set_id),
                                  "address": addr, "member": hit}
        if port is not None:
            lookup["port"] = port
        lookups.append(lookup)
        return hit

    def _port_ok(self, port: int, addr: str, ranges: tuple[proto.PortRange, ...],
                 named: tuple[str, ...], lookups: list[dict[str, Any]]) -> bool:
        if any(r.first <= port <= r.last for r in ranges):
            return True
        return any(self.in_set(n, addr, lookups, port=port) for n in named)

    def match(self, r: proto.Rule, lookups: list[dict[str, Any]]) -> tuple[bool, str]:
        f = self.flow
        if r.ip_version == 6:
            return False, "ipVersion 6 (the flow is IPv4)"
        if r.protocol is not None and f.protocol != r.protocol:
            return False, f"protocol is not {_proto(r.protocol)}"
        if r.not_protocol is not None and f.protocol == r.not_protocol:
            return False, f"protocol is {_proto(r.not_protocol)} (notProtocol)"
        for side, addr, nets, not_nets in (("source", f.src, r.src_nets, r.not_src_nets),
                                           ("destination", f.dst, r.dst_nets, r.not_dst_nets)):
            if nets and not _in_nets(addr, nets):
                return False, f"{side} {addr} not in nets {list(nets)}"
            if not_nets and _in_nets(addr, not_nets):
                return False, f"{side} {addr} in notNets {list(not_nets)}"
        for side, addr, sets, not_sets in (
                ("source", f.src, r.src_ip_set_ids, r.not_src_ip_set_ids),
                ("destination", f.dst, r.dst_ip_set_ids, r.not_dst_ip_set_ids)):
            for s in sets:
                if not self.in_set(s, addr, lookups):
                    return False, f"{side} {addr} not selected by {self._set_label(s)}"
            for s in not_sets:
                if self.in_set(s, addr, lookups):
                    return False, f"{side} {addr} selected by {self._set_label(s)} (notSelector)"
        port_fields = (r.src_ports, r.src_named_port_ip_set_ids, r.not_src_ports,
                       r.not_src_named_port_ip_set_ids, r.dst_ports, r.dst_named_port_ip_set_ids,
                       r.not_dst_ports, r.not_dst_named_port_ip_set_ids)
        if any(port_fields):
            if not f.has_ports:
                return False, "the rule has ports; the flow's protocol has none"
            for side, port, addr, ranges, named, not_ranges, not_named in (
                    ("source", f.sport, f.src, r.src_ports, r.src_named_port_ip_set_ids,
                     r.not_src_ports, r.not_src_named_port_ip_set_ids),
                    ("destination", f.dport, f.dst, r.dst_ports, r.dst_named_port_ip_set_ids,
                     r.not_dst_ports, r.not_dst_named_port_ip_set_ids)):
                if (ranges or named) and not self._port_ok(port, addr, ranges, named, lookups):
                    return False, f"{side} port {port} not in {_ports_text(ranges, named, self)}"
                if (not_ranges or not_named) and self._port_ok(port, addr, not_ranges,
                                                               not_named, lookups):
                    return False, (f"{side} port {port} in notPorts "
                                   f"{_ports_text(not_ranges, not_named, self)}")
        icmp = (r.icmp_type, r.icmp_code, r.not_icmp_type, r.not_icmp_code)
        if any(v is not None for v in icmp):
            if f.protocol != 1:
                return False, "the rule matches ICMP type/code; the flow is not ICMP"
            if r.icmp_type is not None and f.icmp_type != r.icmp_type:
                return False, f"ICMP type {f.icmp_type} is not {r.icmp_type}"
            if r.icmp_code is not None and f.icmp_code != r.icmp_code:
                return False, f"ICMP code {f.icmp_code} is not {r.icmp_code}"
            if (r.not_icmp_type is not None and f.icmp_type == r.not_icmp_type
                    and (r.not_icmp_code is None or f.icmp_code == r.not_icmp_code)):
                return False, "ICMP type/code excluded by notICMP"
        return True, "every criterion holds"


def _proto(number: int) -> str:
    return PROTOCOL_NAMES.get(number, str(number)).upper()


def _in_nets(addr: str, nets: tuple[str, ...]) -> bool:
    a = ipaddress.ip_address(addr)
    return any(n.version == 4 and a in n
               for n in (ipaddress.ip_network(x, strict=False) for x in nets))


def _ports_text(ranges: tuple[proto.PortRange, ...], named: tuple[str, ...],
                matcher: _Matcher) -> str:
    parts = [str(p.first) if p.first == p.last else f"{p.first}:{p.last}" for p in ranges]
    parts += [f"named port ({matcher._set_label(n)})" for n in named]
    return "[" + ", ".join(parts) + "]"


def rule_text(r: proto.Rule, label: Any) -> str:
    """A rule as the user wrote it, selectors in place of IP-set ids: e.g. `allow tcp from
    selector(role == 'api') to ports [5432]`. `label(set_id)` gives a set's selector."""
    words = [r.action]
    if r.ip_version:
        words.append(f"ipv{r.ip_version}")
    if r.protocol is not None:
        words.append(PROTOCOL_NAMES.get(r.protocol, str(r.protocol)))
    if r.not_protocol is not None:
        words.append(f"not-protocol {PROTOCOL_NAMES.get(r.not_protocol, str(r.not_protocol))}")
    for side, nets, not_nets, sets, not_sets, ports, named, not_ports, not_named in (
            ("from", r.src_nets, r.not_src_nets, r.src_ip_set_ids, r.not_src_ip_set_ids,
             r.src_ports, r.src_named_port_ip_set_ids, r.not_src_ports,
             r.not_src_named_port_ip_set_ids),
            ("to", r.dst_nets, r.not_dst_nets, r.dst_ip_set_ids, r.not_dst_ip_set_ids,
             r.dst_ports, r.dst_named_port_ip_set_ids, r.not_dst_ports,
             r.not_dst_named_port_ip_set_ids)):
        crit = []
        if nets:
            crit.append(f"nets {list(nets)}")
        if not_nets:
            crit.append(f"notNets {list(not_nets)}")
        crit += [f"selector({label(s)})" for s in sets]
        crit += [f"notSelector({label(s)})" for s in not_sets]
        if ports or named:
            crit.append("ports [" + ", ".join(
                [str(p.first) if p.first == p.last else f"{p.first}:{p.last}" for p in ports]
                + [f"named {label(n)}" for n in named]) + "]")
        if not_ports or not_named:
            crit.append("notPorts [" + ", ".join(
                [str(p.first) if p.first == p.last else f"{p.first}:{p.last}"
                 for p in not_ports] + [f"named {label(n)}" for n in not_named]) + "]")
        if crit:
            words.append(side + " " + " ".join(crit))
    if r.icmp_type is not None:
        words.append(f"icmp type {r.icmp_type}" + (
            f" code {r.icmp_code}" if r.icmp_code is not None else ""))
    if r.not_icmp_type is not None:
        words.append(f"notICMP type {r.not_icmp_type}" + (
            f" code {r.not_icmp_code}" if r.not_icmp_code is not None else ""))
    if len(words) == 1:
        words.append("everything")
    return " ".join(words)


def explain_direction(model: ExplainModel, endpoint: proto.WorkloadEndpoint, name: str,
                      direction: str, flow: Flow) -> DirectionVerdict:
    """The verdict `endpoint` (local to the model's node) gives `flow` in `direction`."""
    inbound = direction == INGRESS
    matcher = _Matcher(model, flow)
    steps: list[RuleStep] = []
    tiers: list[dict[str, Any]] = []

    def decided(verdict: str, by: str, tier: str | None, owner: str | None,
                step: RuleStep | None, counter: str) -> DirectionVerdict:
        return DirectionVerdict(direction, name, verdict, by, tier, owner,
                                step.index if step else None, step.text if step else None,
                                counter, steps, tiers)

    def scan(kind: str, tier: str, owner: str, rules: tuple[proto.Rule, ...]) -> RuleStep | None:
        for i, r in enumerate(rules):
            lookups: list[dict[str, Any]] = []
            ok, why = matcher.match(r, lookups)
            step = RuleStep(kind, tier, owner, i, r.action, rule_text(r, matcher._set_label),
                            ok, why, r.rule_id, lookups)
            steps.append(step)
            if ok and r.action != "log":
                return step
        return None

    for tier in endpoint.tiers:
        names = tier.ingress_policies if inbound else tier.egress_policies
        if not names:
            continue
        tiers.append({"tier": tier.name, "policies": list(names),
                      "default_action": tier.default_action})
        passed = False
        for policy_name in names:
            policy = model.state.policies.get(proto.PolicyID(tier.name, policy_name))
            if policy is None:  # the dataplane fails closed on an unknown policy
                return decided("deny", "unknown-policy", tier.name, policy_name, None,
                               f"unknown:{tier.name}/{policy_name}")
            rules = policy.inbound_rules if inbound else policy.outbound_rules
            step = scan("policy", tier.name, policy_name, rules)
            if step is None:
                continue
            if step.action in ("allow", "deny"):
                return decided(step.action, "rule", tier.name, policy_name, step,
                               step.rule_id)
            passed = True  # pass: on to the next tier
            break
        if not passed and str(tier.default_action).lower() != "pass":
            return decided("deny", "tier-end", tier.name, None, None,
                           f"tier-end:{tier.name}/{direction}")
    for profile_id in endpoint.profile_ids:
        profile = model.state.profiles.get(profile_id)
        tiers.append({"profile": profile_id})
        if profile is None:
            return decided("deny", "unknown-profile", None, profile_id, None,
                           f"unknown:profile/{profile_id}")
        rules = profile.inbound_rules if inbound else profile.outbound_rules
        step = scan("profile", "", profile_id, rules)
        if step is not None and step.action in ("allow", "deny"):
            return decided(step.action, "rule", None, profile_id, step, step.rule_id)
    return decided("deny", "default-deny", None, None, None, f"default-deny/{direction}")


def rule_catalogue(model: ExplainModel) -> dict[str, dict[str, Any]]:
    """Every rule of the node's active policies and profiles by `rule_id` (the BPF
    dataplane's counter name): kind, tier, policy (or profile), direction, index, action
    and the rule as written (selectors, not IP-set ids)."""
    matcher = _Matcher(model, Flow("0.0.0.0", "0.0.0.0", 0))
    out: dict[str, dict[str, Any]] = {}
    owners: list[tuple[str, str, str, Any]] = [
        ("policy", pid.tier, pid.name, pol) for pid, pol in model.state.policies.items()]
    owners += [("profile", "", name, prof) for name, prof in model.state.profiles.items()]
    for kind, tier, name, owner in owners:
        for direction, rules in ((INGRESS, owner.inbound_rules), (EGRESS, owner.outbound_rules)):
            for i, r in enumerate(rules):
                out[r.rule_id] = {"kind": kind, "tier": tier or None, "policy": name,
                                  "direction": direction, "rule": i, "action": r.action,
                                  "match": rule_text(r, matcher._set_label)}
    return out
