"""The lab's IP families: one mapping from the lab's IPv4 plan to IPv6, used everywhere.

Role: prepare a validated `Scenario` for `--ip-family ipv4|ipv6|dual` (`apply_ip_family`).
Every lab address and every CIDR a scenario names is IPv4; under `ipv6` or `dual` each one
gets its IPv6 twin by ONE function, `ipv6_for` / `ipv6_network_for`: the IPv4 address is
embedded in the low 32 bits of the lab's ULA /96, `LAB_IPV6_PREFIX`:

    10.65.1.10     -> fd65:6c61:6200::a41:10a      (printed as hex, never dotted)
    10.65.0.0/16   -> fd65:6c61:6200::a41:0/112    (prefix length + 96)
    198.18.0.1/15  -> fd65:6c61:6200::c612:1/111   (node underlay)

Because the mapping is one injective function that keeps prefix containment (a in N iff
ipv6_for(a) in ipv6_network_for(N)), a rewritten scenario gives the same verdicts as the
original by construction: every selector, port and label is unchanged and every CIDR test
has the same answer.

What is rewritten (inputs: the scenario's pods, probes and resource documents):
- pods: `ipv6` = the twin of the pod's (explicit or allocated) IPv4 address, or the IPv6
  address its `ip:` names (refused under `ipv4`; policies naming it are not rewritten:
  they are IPv6 already); under `ipv6` the pod has only that address (`has_ipv4` False),
  under `dual` both; two pods may not end up with one IPv6 address; when the scenario
  declares IP pools, every pod's IPv6 address must lie in one of its IPv6 pools (the
  twins of its IPv4 pools, or its own IPv6 pools, kept as written); a pod's floating IPs
  (`floatingIPs`) get their twins: `ipv6` replaces them, `dual` adds each twin after its
  IPv4 address (the Pod's annotation lists both; the agent NATs each to the pod's address
  of its family, in that family's nat table);
- probes: under `ipv6` each probe targets the IPv6 twin of its target; under `dual` each
  probe runs twice, IPv4 then IPv6 (`ProbeSpec.family` says which);
- CIDRs in resources: NetworkSet/GlobalNetworkSet `nets`, HostEndpoint `expectedIPs`,
  Kubernetes `ipBlock` (`cidr`, `except`), IPPool `cidr` (and `blockSize` + 96). Under
  `ipv6` they are replaced; under `dual` the IPv6 twin is added beside the IPv4 one
  (lists get both; a Kubernetes ipBlock peer is followed by its twin peer; an IPPool gets
  a twin pool `<name>-v6`). Encapsulation as a dual-stack Calico cluster has it: a VXLAN
  pool's twin keeps its vxlanMode (the agent's vxlan-v6.calico carries it); an IPIP pool's
  twin gets `ipipMode: Never` and is routed by BGP, unencapsulated -- Calico has no IPv6
  IPIP (its validator refuses ipipMode on an IPv6 pool), so with an IPIP IPv4 pool the
  IPv6 pool of a dual-stack cluster is a plain BGP-routed one.
- Calico rules: under `ipv6` their `nets`/`notNets` are mapped, `ipVersion: 4` becomes 6,
  ICMP becomes ICMPv6 with the counterpart type (echo request 8 -> 128, ...). Under `dual`
  a rule naming IPv4 CIDRs or ICMP becomes two rules, the original pinned to ipVersion 4
  and its IPv6 twin pinned to ipVersion 6 (one rule may not mix families); a rule already
  pinned to `ipVersion: 4` stays IPv4-only, as written.
Nodes: the topology gives each node (and the `external` client) the twin of its underlay
address beside the IPv4 one under `ipv6` and `dual`, and the Node resource carries it as
`spec.bgp.ipv6Address`, so confd renders IPv6 BGP sessions. The IPv4 underlay stays even
under `ipv6`: confd needs `spec.bgp.ipv4Address` (BIRD's router id) to run BGP at all.

- Services: an IPv4 Service's clusterIP(s), `externalIPs` and load-balancer ingress IPs
  get their twins (`ipv6`: replaced, ipFamilies [IPv6]; `dual`: clusterIPs [v4, v6],
  ipFamilies [IPv4, IPv6], RequireDualStack); a given IPv4 EndpointSlice gets its twin
  `<name>-v6` (addressType IPv6, addresses mapped; `ipv6`: instead of it). The lab's
  generated slices follow the Service's ipFamilies (lab.services). A probe to a VIP then
  goes to the VIP's twin, like any other target address.

  NodePort and LoadBalancer Services keep their nodePorts: the agent (BPF) and the lab's
  kube-proxy rules (iptables) serve them on the nodes' IPv6 addresses too, so a probe to
  `node/NAME` goes to the twin of that node's underlay address, from the `external`
  client's twin address, like any other target.

Out of scope, refused with `ScenarioError` naming the scenario and the resource (never
skipped silently): an IPv6 pool with ipipMode other than Never (Calico has no IPv6 IPIP).

Easy to get wrong: `ipaddress` prints an IPv6 address with an embedded IPv4 tail as hex
(fd65:6c61:6200::a41:10a), which is what the kernel, BIRD and flow logs print too; compare
addresses as objects, never as text in another notation.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
from collections.abc import Callable
from typing import Any

from pyfelix.lab.scenario import (
    EXTERNAL_CLIENT_IP,
    PodSpec,
    ProbeSpec,
    Scenario,
    ScenarioError,
    Step,
)

IP_FAMILIES = ("ipv4", "ipv6", "dual")
DEFAULT_IP_FAMILY = "ipv4"
LAB_IPV6_PREFIX = ipaddress.IPv6Network("fd65:6c61:6200::/96")  # "lab" in the ULA's bytes
IPV6_PREFIX_EXTRA = 128 - 32  # prefix length added to an IPv4 CIDR's
# The pods' IPv6 gateway, as Calico's CNI plugin sets it: the link-local address the
# kernel derives (EUI-64) from the host-side veth's fixed MAC ee:ee:ee:ee:ee:ee.
POD_GATEWAY6 = ipaddress.IPv6Address("fe80::ecee:eeff:feee:eeee")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class IpFamilyUnsupported(ScenarioError):
    """The scenario uses what the lab cannot run over IPv6; names each resource."""

    def __init__(self, scenario: str, ip_family: str, problems: list[str]) -> None:
        super().__init__(scenario, problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        self.args = (f"scenario {scenario} cannot run with --ip-family {ip_family}:\n{lines}",)

    def __str__(self) -> str:
        return str(self.args[0])


def families(ip_family: str) -> tuple[int, ...]:
    """IP versions a lab of `ip_family` runs: (4,), (6,) or (4, 6)."""
    return {"ipv4": (4,), "ipv6": (6,), "dual": (4, 6)}[ip_family]


def ipv6_for(address: ipaddress.IPv4Address) -> ipaddress.IPv6Address:
    """The lab's IPv6 twin of an IPv4 address (embedded in `LAB_IPV6_PREFIX`)."""
    return ipaddress.IPv6Address(int(LAB_IPV6_PREFIX.network_address) | int(address))


def ipv6_network_for(network: ipaddress.IPv4Network) -> ipaddress.IPv6Network:
    """The lab's IPv6 twin of an IPv4 CIDR: same bits after the /96, prefix length + 96."""
    return ipaddress.IPv6Network(
        (ipv6_for(network.network_address), network.prefixlen + IPV6_PREFIX_EXTRA))


def ipv6_interface_for(interface: ipaddress.IPv4Interface) -> ipaddress.IPv6Interface:
    """The twin of an address with its prefix length (an underlay address, say)."""
    return ipaddress.IPv6Interface(
        (ipv6_for(interface.ip), interface.network.prefixlen + IPV6_PREFIX_EXTRA))


def twin_text(text: str) -> str | None:
    """The IPv6 twin of an IPv4 address or CIDR written as text (a CIDR keeps its `/n`
    form, a bare address stays bare); None when `text` is not IPv4 (IPv6 already, or not
    an address: the resource model reports that)."""
    try:
        if "/" in text:
            net = ipaddress.ip_network(text, strict=False)
            if isinstance(net, ipaddress.IPv4Network):
                host = ipaddress.IPv4Address(text.split("/", 1)[0])
                return f"{ipv6_for(host)}/{net.prefixlen + IPV6_PREFIX_EXTRA}"
            return None
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    return str(ipv6_for(addr)) if isinstance(addr, ipaddress.IPv4Address) else None


def external_client_ipv6() -> ipaddress.IPv6Interface:
    """The `external` probe client's IPv6 address on the underlay bridge."""
    return ipv6_interface_for(EXTERNAL_CLIENT_IP)


# --- scenario --------------------------------------------------------------------------


def apply_ip_family(scenario: Scenario, ip_family: str) -> Scenario:
    """`scenario` prepared for `ip_family` (see the module docstring); `ipv4` returns it
    unchanged. ScenarioError when the scenario uses something the lab cannot run over
    IPv6, naming the scenario and each such resource."""
    if ip_family not in IP_FAMILIES:
        raise ValueError(f"ip family must be one of {list(IP_FAMILIES)}, not {ip_family!r}")
    if ip_family == "ipv4":
        given = [f"pods: {p.key}: ip: {p.ipv6_given} is IPv6: run with --ip-family ipv6 "
                 "or dual" for p in scenario.pods if p.ipv6_given is not None]
        if given:
            raise IpFamilyUnsupported(scenario.name, ip_family, given)
        return scenario
    problems = _unsupported(scenario)
    dual = ip_family == "dual"
    pods = tuple(dataclasses.replace(p, ipv6=p.ipv6_given or ipv6_for(p.ip), has_ipv4=dual,
                                     floating_ips=_floating_ips_for(p.floating_ips, dual))
                 for p in scenario.pods)
    owners: dict[ipaddress.IPv6Address | None, str] = {}
    for pod in pods:
        if pod.ipv6 in owners:
            problems.append(f"pods: {pod.key}: ip: {pod.ipv6} is also {owners[pod.ipv6]}'s "
                            "IPv6 address (lab.family maps IPv4 addresses into "
                            f"{LAB_IPV6_PREFIX})")
        owners.setdefault(pod.ipv6, pod.key)
    problems += _outside_ipv6_pools(pods, rewrite_documents(
        scenario.steps[0].apply if scenario.steps else (), ip_family))
    if problems:
        raise IpFamilyUnsupported(scenario.name, ip_family, problems)
    ipv6_of = {p.key: p.ipv6 for p in pods}
    steps = tuple(Step(apply=rewrite_documents(step.apply, ip_family),
                       delete=step.delete,
                       probes=_probes_for(step.probes, ip_family, ipv6_of))
                  for step in scenario.steps)
    return dataclasses.replace(scenario, pods=pods, steps=steps,
                               resources=rewrite_documents(scenario.resources, ip_family),
                               ip_family=ip_family)


def _outside_ipv6_pools(pods: tuple[PodSpec, ...],
                        first_step: tuple[dict[str, Any], ...]) -> list[str]:
    """When the scenario declares IP pools (then the lab adds no default pool), every pod's
    IPv6 address must lie in one of the enabled IPv6 pools (the twins of its IPv4 pools,
    or its own IPv6 pools): BIRD exports only routes inside pools, so a pod outside would
    never be reached from another node."""
    pools = [d for d in first_step if d.get("kind") == "IPPool"]
    if not pools:
        return []
    nets: list[ipaddress.IPv6Network] = []
    for pool in pools:
        spec = pool.get("spec") or {}
        try:
            net = ipaddress.ip_network(str(spec.get("cidr", "")), strict=False)
        except ValueError:
            continue
        if isinstance(net, ipaddress.IPv6Network) and not spec.get("disabled"):
            nets.append(net)
    names = ", ".join(f"{p['metadata']['name']} {p.get('spec', {}).get('cidr')}"
                      for p in pools)
    return [f"pods: {p.key}: ip: {p.ipv6} is in no enabled IPv6 IPPool ({names}); give the "
            f"pod an IPv6 ip: inside one, or declare a pool inside {LAB_IPV6_PREFIX} "
            "(lab.family maps the IPv4 plan there)"
            for p in pods if p.ipv6 is not None and not any(p.ipv6 in n for n in nets)]


def _floating_ips_for(addresses: tuple[IPAddress, ...], dual: bool) -> tuple[IPAddress, ...]:
    """A pod's floating IPs with each IPv4 one's twin after it (`dual`) or instead."""
    out: list[IPAddress] = []
    for address in addresses:
        if isinstance(address, ipaddress.IPv4Address):
            out.extend((address, ipv6_for(address)) if dual else (ipv6_for(address),))
        else:
            out.append(address)
    return tuple(out)


def _unsupported(scenario: Scenario) -> list[str]:
    problems: list[str] = []
    documents = [*scenario.resources, *(d for s in scenario.steps for d in s.apply)]
    seen: set[tuple[str, str]] = set()
    for doc in documents:
        kind = str(doc.get("kind"))
        meta = doc.get("metadata") or {}
        name = "/".join(str(x) for x in (meta.get("namespace"), meta.get("name")) if x)
        if (kind, name) in seen:
            continue
        seen.add((kind, name))
        spec = doc.get("spec") or {}
        if (kind == "IPPool" and str(spec.get("ipipMode", "Never")) != "Never"
              and ":" in str(spec.get("cidr", ""))):
            problems.append(f"IPPool {name}: spec.ipipMode: Calico has no IPv6 IPIP (an "
                            "IPv6 pool must have ipipMode Never)")
    return problems


def _probes_for(probes: tuple[ProbeSpec, ...], ip_family: str,
                ipv6_of: dict[str, ipaddress.IPv6Address | None]) -> tuple[ProbeSpec, ...]:
    """Each probe over IPv6 (to the target pod's IPv6 address, else the twin of its
    target address), after its IPv4 self under `dual`."""
    out: list[ProbeSpec] = []
    for probe in probes:
        target6 = ipv6_of.get(probe.target) or ipv6_for(probe.target_ip)  # type: ignore[arg-type]
        twin = dataclasses.replace(probe, target_ip=target6)
        out.extend((probe, twin) if ip_family == "dual" else (twin,))
    return tuple(out)


# --- resources -------------------------------------------------------------------------


def rewrite_documents(documents: tuple[dict[str, Any], ...],
                      ip_family: str) -> tuple[dict[str, Any], ...]:
    """Every document with its CIDRs rewritten (`ipv6`) or twinned (`dual`); IPPools are
    replaced (`ipv6`) or joined by a twin `<name>-v6` (`dual`). Documents are copied."""
    dual = ip_family == "dual"
    out: list[dict[str, Any]] = []
    for original in documents:
        doc = copy.deepcopy(original)
        if doc.get("kind") == "IPPool":
            twin = _pool_twin(doc)
            if twin is None:  # an IPv6 (or unparsable) pool: kept as written
                out.append(doc)
            else:
                out.extend((doc, twin) if dual else (twin,))
            continue
        if doc.get("kind") == "Service":
            _service_to_family(doc, dual)
            out.append(doc)
            continue
        if doc.get("kind") == "EndpointSlice":
            twin = _slice_twin(doc, dual)
            if twin is None:  # IPv6 or FQDN already: kept as written
                out.append(doc)
            else:
                out.extend((doc, twin) if dual else (twin,))
            continue
        _rewrite(doc, dual)
        out.append(doc)
    return tuple(out)


def _twin_addresses(values: list[Any], dual: bool) -> list[Any]:
    """A list of addresses with each IPv4 one's twin after it (`dual`) or instead."""
    return _cidr_list(values, dual)


def _service_to_family(service: dict[str, Any], dual: bool) -> None:
    """In place: an IPv4 Service's cluster IP(s) and external / load-balancer IPs get their
    twins. `ipv6`: clusterIP(s) become the twins, ipFamilies [IPv6], ipFamilyPolicy
    SingleStack; `dual`: clusterIPs [v4, v6] (clusterIP stays the IPv4 one, the primary),
    ipFamilies [IPv4, IPv6], ipFamilyPolicy RequireDualStack, as the API server writes a
    dual-stack Service. A headless or unallocated Service keeps its clusterIP."""
    spec = service.setdefault("spec", {})
    cluster_ip = spec.get("clusterIP")
    twin = twin_text(cluster_ip) if isinstance(cluster_ip, str) else None
    if twin is not None:
        listed = spec.get("clusterIPs")
        ips = [str(x) for x in listed] if isinstance(listed, list) and listed else [cluster_ip]
        spec["clusterIPs"] = _twin_addresses(ips, dual)
        spec["clusterIP"] = spec["clusterIPs"][0]
        spec["ipFamilies"] = ["IPv4", "IPv6"] if dual else ["IPv6"]
        spec["ipFamilyPolicy"] = "RequireDualStack" if dual else "SingleStack"
    if isinstance(spec.get("externalIPs"), list):
        spec["externalIPs"] = _twin_addresses(spec["externalIPs"], dual)
    ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress")
    if isinstance(ingress, list):
        out: list[Any] = []
        for entry in ingress:
            text = entry.get("ip") if isinstance(entry, dict) else None
            mapped = twin_text(text) if isinstance(text, str) else None
            if mapped is None:
                out.append(entry)
            else:
                out.extend((entry, {**entry, "ip": mapped}) if dual else ({**entry, "ip": mapped},))
        service["status"]["loadBalancer"]["ingress"] = out


def _slice_twin(eps: dict[str, Any], dual: bool) -> dict[str, Any] | None:
    """The IPv6 twin of an IPv4 EndpointSlice: addressType IPv6, every address mapped, named
    `<name>-v6` (under `ipv6` it replaces the original, under `dual` it joins it); None for
    any other slice (IPv6 or FQDN already)."""
    if eps.get("addressType") != "IPv4":
        return None
    twin = copy.deepcopy(eps)
    twin["addressType"] = "IPv6"
    for endpoint in twin.get("endpoints") or []:
        if isinstance(endpoint, dict) and isinstance(endpoint.get("addresses"), list):
            endpoint["addresses"] = [twin_text(a) or a if isinstance(a, str) else a
                                     for a in endpoint["addresses"]]
    twin["metadata"] = {**twin.get("metadata", {}),
                        "name": f"{twin['metadata']['name']}-v6"}
    return twin


def _pool_twin(pool: dict[str, Any]) -> dict[str, Any] | None:
    """The IPv6 twin `<name>-v6` of an IPv4 pool; None for any other (IPv6 already, or
    bad: the resource model says so). vxlanMode is kept; ipipMode becomes Never (no IPv6
    IPIP in Calico: the twin of an IPIP pool is routed by BGP, see the module docstring)."""
    twin = copy.deepcopy(pool)
    spec = twin.setdefault("spec", {})
    cidr = twin_text(str(spec.get("cidr", "")))
    if cidr is None:
        return None
    spec["cidr"] = cidr
    if "ipipMode" in spec:
        spec["ipipMode"] = "Never"
    if isinstance(spec.get("blockSize"), int):
        spec["blockSize"] += IPV6_PREFIX_EXTRA
    twin["metadata"] = {**twin.get("metadata", {}),
                        "name": f"{twin['metadata']['name']}-v6"}
    return twin


_CIDR_LIST_KEYS = ("nets", "notNets", "expectedIPs")
_RULE_LIST_KEYS = ("ingress", "egress")
# ICMP types and their ICMPv6 counterparts (echo reply/request, destination unreachable,
# time exceeded, parameter problem); a type without one keeps its number
ICMP_TO_ICMPV6_TYPE = {0: 129, 8: 128, 3: 1, 11: 3, 12: 4}
_ICMP = ("ICMP", "icmp", 1)


def _rewrite(node: Any, dual: bool) -> None:
    """Rewrite in place, walking mappings and lists."""
    if isinstance(node, list):
        for item in node:
            _rewrite(item, dual)
        _twin_ip_block_peers(node, dual)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in _RULE_LIST_KEYS and isinstance(value, list):
            node[key] = _calico_rules(value, dual)
            _rewrite([r for r in node[key] if not _is_calico_rule(r)], dual)
        elif key in _CIDR_LIST_KEYS and isinstance(value, list):
            node[key] = _cidr_list(value, dual)
        elif key == "ipBlock" and isinstance(value, dict) and not dual:
            _ip_block_to_v6(value)
        elif key == "ipVersion" and value == 4 and not dual:
            node[key] = 6
        else:
            _rewrite(value, dual)


def _is_calico_rule(rule: object) -> bool:
    return isinstance(rule, dict) and "action" in rule


def _family_bound(rule: dict[str, Any]) -> bool:
    """Does the rule name ICMP or IPv4 CIDRs (so it matches one family only)?"""
    if rule.get("protocol") in _ICMP or rule.get("notProtocol") in _ICMP \
            or "icmp" in rule or "notICMP" in rule:
        return True
    return any(isinstance(text, str) and twin_text(text) is not None
               for side in ("source", "destination")
               for key in ("nets", "notNets")
               for text in ((rule.get(side) or {}).get(key) or []))


def _to_ipv6_rule(rule: dict[str, Any]) -> dict[str, Any]:
    """The rule's IPv6 twin: CIDRs mapped, ICMP -> ICMPv6 (types mapped by
    ICMP_TO_ICMPV6_TYPE), ipVersion 4 -> 6."""
    twin = copy.deepcopy(rule)
    for key in ("protocol", "notProtocol"):
        if twin.get(key) in _ICMP:
            twin[key] = "ICMPv6"
    for key in ("icmp", "notICMP"):
        fields = twin.get(key)
        if isinstance(fields, dict) and isinstance(fields.get("type"), int):
            fields["type"] = ICMP_TO_ICMPV6_TYPE.get(fields["type"], fields["type"])
    for side in ("source", "destination"):
        entity = twin.get(side)
        if isinstance(entity, dict):
            for key in ("nets", "notNets"):
                if isinstance(entity.get(key), list):
                    entity[key] = _cidr_list(entity[key], dual=False)
    if twin.get("ipVersion") == 4:
        twin["ipVersion"] = 6
    return twin


def _calico_rules(rules: list[Any], dual: bool) -> list[Any]:
    """Calico rules: under `ipv6` each becomes its IPv6 twin. Under `dual`, a rule that
    names ICMP or IPv4 CIDRs becomes two, the original pinned to `ipVersion: 4` and its
    twin to `ipVersion: 6`, in that order: one rule may not mix the families' CIDRs
    (Calico's validator refuses it, and so does the agent's model), and a `notProtocol:
    ICMP` rule left unpinned would match every IPv6 packet. A rule already pinned to
    ipVersion 4 stays IPv4-only under `dual`, as written. Kubernetes rules (no `action`)
    are left to the walk (`ipBlock`)."""
    out: list[Any] = []
    for rule in rules:
        if not _is_calico_rule(rule):
            out.append(rule)
        elif not dual:
            out.append(_to_ipv6_rule(rule))
        elif rule.get("ipVersion") in (4, 6) or not _family_bound(rule):
            out.append(rule)
        else:
            out.extend(({**rule, "ipVersion": 4}, {**_to_ipv6_rule(rule), "ipVersion": 6}))
    return out


def _cidr_list(values: list[Any], dual: bool) -> list[Any]:
    out: list[Any] = []
    for value in values:
        twin = twin_text(value) if isinstance(value, str) else None
        if twin is None:
            out.append(value)
        else:
            out.extend((value, twin) if dual else (twin,))
    return out


def _ip_block_to_v6(block: dict[str, Any]) -> None:
    _map_text(block, "cidr", twin_text)
    if isinstance(block.get("except"), list):
        block["except"] = [twin_text(x) or x if isinstance(x, str) else x
                           for x in block["except"]]


def _map_text(mapping: dict[str, Any], key: str, fn: Callable[[str], str | None]) -> None:
    value = mapping.get(key)
    if isinstance(value, str):
        mapping[key] = fn(value) or value


def _twin_ip_block_peers(items: list[Any], dual: bool) -> None:
    """Under `dual`, each Kubernetes peer `{ipBlock: {...}}` (IPv4) in a from/to list is
    followed by its IPv6 twin peer (an ipBlock holds one CIDR)."""
    if not dual:
        return
    index = 0
    while index < len(items):
        item = items[index]
        block = item.get("ipBlock") if isinstance(item, dict) else None
        if isinstance(block, dict) and twin_text(str(block.get("cidr", ""))) is not None:
            twin = copy.deepcopy(item)
            _ip_block_to_v6(twin["ipBlock"])
            items.insert(index + 1, twin)
            index += 1
        index += 1
