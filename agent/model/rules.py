"""Calico v3 policy rules: Rule, EntityRule, Port, ICMP match, parsed with full validation.

Inputs: the `ingress`/`egress` lists of a (Global)NetworkPolicy or Profile as raw YAML.
Outputs: immutable `Rule` objects whose fields mirror Calico's API (names in snake_case),
with protocol names turned into numbers and ports into ranges or names.

Validation follows Calico's (libcalico-go `validator/v3`):
- action is Allow, Deny, Log or Pass; protocol/notProtocol a name (TCP, UDP, ICMP, ICMPv6,
  SCTP, UDPLite, also lower case) or a number 1-255;
- ports/notPorts (numbers 1-65535, "lo:hi" ranges, or named ports) need a protocol that has
  ports (TCP, UDP, SCTP, UDPLite);
- icmp/notICMP need protocol ICMP or ICMPv6; a code needs a type; ICMP implies IPv4 and
  ICMPv6 IPv6 when ipVersion is given;
- nets/notNets are CIDRs (a bare address means /32 or /128), normalised to their network;
  one rule may not mix IPv4 and IPv6 CIDRs, nor contradict ipVersion;
- selectors must parse and be at most max_selector_length characters; `global()` is only
  valid, alone, as a namespaceSelector;
- at most max_rules_per_policy rules per policy or profile (`check_rule_count`), and at
  most max_selector_text_per_policy characters of selectors in all (`check_selector_text`).
Unsupported Calico match fields (`http`, `services`) are REJECTED, not ignored: ignoring a
match field would make a rule match more than its author wrote.

Selector semantics of an EntityRule inside a namespaced policy (own namespace by default,
`pcns.`-prefixed namespace labels for namespaceSelector) are computed by
`agent.model.selectors.entity_selector`, not stored here: the raw texts are kept as written.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Any, NoReturn

from pyfelix.agent import selector
from pyfelix.agent.inputs.limits import LIMITS
from pyfelix.agent.model.fields import Fields, checked_int, describe_value
from pyfelix.agent.model.names import is_decimal, is_port_name

ACTIONS = ("Allow", "Deny", "Log", "Pass")
PROTOCOL_NUMBERS = {"TCP": 6, "UDP": 17, "ICMP": 1, "ICMPv6": 58, "SCTP": 132, "UDPLite": 136}
PROTOCOL_NAMES = {v: k for k, v in PROTOCOL_NUMBERS.items()}
# Accepted spellings: as documented, lower case, upper case.
_PROTOCOL_SPELLINGS = {spelling: number for name, number in PROTOCOL_NUMBERS.items()
                       for spelling in (name, name.lower(), name.upper())}
PROTOCOLS_WITH_PORTS = frozenset({6, 17, 132, 136})
ICMP_PROTOCOLS = frozenset({1, 58})
PROTO_ICMP = 1
PROTO_ICMPV6 = 58

_GLOBAL_ONLY_RE = re.compile(r"\s*global\s*\(\s*\)\s*")  # fullmatch only


@dataclass(frozen=True, slots=True)
class Port:
    """A port match: a number or range (`first`..`last`), or a named port (`name`)."""

    first: int = 0
    last: int = 0
    name: str = ""

    def __str__(self) -> str:
        if self.name:
            return self.name
        return str(self.first) if self.first == self.last else f"{self.first}:{self.last}"


@dataclass(frozen=True, slots=True)
class ICMPMatch:
    type: int | None = None
    code: int | None = None


@dataclass(frozen=True, slots=True)
class ServiceAccountMatch:
    """Match endpoints by service account: any of `names`, and/or by `selector` over the
    service account's labels (both given: both must match)."""

    names: tuple[str, ...] = ()
    selector: str = ""


@dataclass(frozen=True, slots=True)
class EntityRule:
    nets: tuple[str, ...] = ()
    not_nets: tuple[str, ...] = ()
    selector: str = ""
    not_selector: str = ""
    namespace_selector: str = ""
    ports: tuple[Port, ...] = ()
    not_ports: tuple[Port, ...] = ()
    service_accounts: ServiceAccountMatch | None = None

    def named_ports(self) -> tuple[Port, ...]:
        return tuple(p for p in self.ports if p.name)


@dataclass(frozen=True, slots=True)
class Rule:
    action: str
    ip_version: int | None = None
    protocol: int | None = None
    not_protocol: int | None = None
    icmp: ICMPMatch | None = None
    not_icmp: ICMPMatch | None = None
    source: EntityRule = EntityRule()
    destination: EntityRule = EntityRule()


def protocol_number(value: object, fields: Fields, key: str) -> int | None:
    """Calico accepts protocol names (as documented, or in lower case) or 1..255."""
    if value is None:
        return None
    if isinstance(value, bool):
        fields.fail(key, f"invalid protocol {value!r}")
    if isinstance(value, int):
        if 1 <= value <= 255:
            return value
        fields.fail(key, f"protocol number {describe_value(value)} is out of range [1, 255]")
    if isinstance(value, str):
        number = _PROTOCOL_SPELLINGS.get(value)
        if number is not None:
            return number
        if is_decimal(value) and len(value) <= 3 and 1 <= int(value) <= 255:
            return int(value)
    shown = describe_value(value) if isinstance(value, str | int | float) else type(value).__name__
    fields.fail(key, f"unknown protocol {shown[:60]} (expected one of "
                f"{', '.join(PROTOCOL_NUMBERS)} or a number 1-255)")


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@functools.lru_cache(maxsize=16384)
def cached_network(text: str) -> tuple[str, Network] | None:
    """(normalised text, network) of a CIDR or bare address, or None when invalid.

    Cached: the same CIDRs recur across policies and every resync re-parses every endpoint.
    """
    try:
        network = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        return None
    return str(network), network


def normalise_ip(text: str) -> str | None:
    """Canonical text of a single IPv4/IPv6 address, or None when `text` is not one.

    IPv4 goes through `inet_pton` (~20x faster than `ipaddress`; every pod and endpoint
    carries an address); anything it rejects, and all IPv6 (whose text forms must stay
    exactly `ipaddress`'s), goes through `ipaddress`, the reference.
    """
    if ":" not in text:
        try:
            return socket.inet_ntop(socket.AF_INET, socket.inet_pton(socket.AF_INET, text))
        except (OSError, ValueError):
            pass
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def _parse_cidr(text: Any, fields: Fields, key: str) -> tuple[str, Network]:
    if not isinstance(text, str):
        fields.fail(key, f"expected a CIDR string, got {type(text).__name__}")
    parsed = cached_network(text)
    if parsed is None:
        fields.fail(key, f"invalid CIDR {text[:60]!r}")
    return parsed


def parse_network(text: Any, fields: Fields, key: str) -> Network:
    """Like `parse_net`, returning the `ipaddress` network object."""
    return _parse_cidr(text, fields, key)[1]


def parse_net(text: Any, fields: Fields, key: str) -> str:
    """A CIDR or bare address, normalised to its network (`10.0.0.5/24` -> `10.0.0.0/24`)."""
    return _parse_cidr(text, fields, key)[0]


def parse_port(value: object, fields: Fields, key: str) -> Port:
    """A rule port: 1-65535, a 'lo:hi' range, or a named port (IANA service name)."""
    if isinstance(value, bool):
        fields.fail(key, f"invalid port {value!r}")
    if isinstance(value, int):
        if not 1 <= value <= 65535:
            fields.fail(key, f"port {describe_value(value)} is out of range [1, 65535]")
        return Port(value, value)
    if isinstance(value, str):
        text = value.strip()
        if ":" in text:
            lo, _, hi = text.partition(":")
            if is_decimal(lo) and is_decimal(hi) and len(lo) <= 5 and len(hi) <= 5:
                first, last = int(lo), int(hi)
                if 1 <= first <= last <= 65535:
                    return Port(first, last)
            fields.fail(key, f"invalid port range {value[:40]!r} (expected 'lo:hi' with "
                        "1 <= lo <= hi <= 65535)")
        if is_decimal(text) and len(text) <= 5:
            return parse_port(int(text), fields, key)
        if is_port_name(value):  # a name exactly as written (no surrounding white space)
            return Port(name=value)
    shown = describe_value(value)[:40] if isinstance(value, str | int | float) else (
        type(value).__name__)
    fields.fail(key, f"invalid port {shown} (a number 1-65535, a 'lo:hi' range, or a port name "
                "of at most 15 lower-case letters, digits and '-')")


def parse_selector(text: str, fields: Fields, key: str) -> str:
    """Check that `text` is a valid Calico selector of at most max_selector_length
    characters (agent.inputs.LIMITS; checked before parsing); returns it unchanged."""
    if not text:
        return text
    if len(text) > LIMITS.max_selector_length:
        _selector_too_long(fields, key, text)
    try:
        selector.parse(text)
    except selector.SelectorError as exc:
        fields.fail(key, f"invalid selector: {exc}")
    except RecursionError:
        fields.fail(key, "invalid selector: nested too deeply")
    return text


def no_global(text: str, fields: Fields, key: str) -> str:
    """Calico: `global()` may only appear as an EntityRule namespaceSelector."""
    if "global(" in text.replace(" ", ""):
        fields.fail(key, "global() can only be used, alone, in a rule's namespaceSelector")
    return text


ENTITY_FIELDS = frozenset({"nets", "notNets", "selector", "notSelector", "namespaceSelector",
                           "ports", "notPorts", "serviceAccounts", "services"})


def _nets(fields: Fields, key: str) -> tuple[str, ...]:
    return tuple(parse_net(n, fields, f"{key}[{i}]") for i, n in enumerate(fields.list(key)))


def _ports(fields: Fields, key: str) -> tuple[Port, ...]:
    return tuple(parse_port(p, fields, f"{key}[{i}]") for i, p in enumerate(fields.list(key)))


_EMPTY_ENTITY = EntityRule()


def parse_entity(fields: Fields) -> EntityRule:
    if not fields.data:
        return _EMPTY_ENTITY
    fields.only(ENTITY_FIELDS)
    if fields.has("services"):
        fields.fail("services", "service matches are not supported by pyfelix")
    service_accounts = None
    if fields.has("serviceAccounts"):
        sa = fields.sub("serviceAccounts", allowed={"names", "selector"})
        service_accounts = ServiceAccountMatch(
            names=sa.str_list("names"),
            selector=no_global(parse_selector(sa.str("selector"), sa, "selector"), sa,
                               "selector"),
        )
    namespace_selector = parse_selector(fields.str("namespaceSelector"), fields,
                                        "namespaceSelector")
    if ("global(" in namespace_selector.replace(" ", "")
            and not _GLOBAL_ONLY_RE.fullmatch(namespace_selector)):
        fields.fail("namespaceSelector", "global() cannot be combined with other selectors")
    return EntityRule(
        nets=_nets(fields, "nets"),
        not_nets=_nets(fields, "notNets"),
        selector=no_global(parse_selector(fields.str("selector"), fields, "selector"),
                           fields, "selector"),
        not_selector=no_global(parse_selector(fields.str("notSelector"), fields, "notSelector"),
                               fields, "notSelector"),
        namespace_selector=namespace_selector,
        ports=_ports(fields, "ports"),
        not_ports=_ports(fields, "notPorts"),
        service_accounts=service_accounts,
    )


def _parse_icmp(fields: Fields, key: str) -> ICMPMatch | None:
    if not fields.has(key):
        return None
    sub = fields.sub(key, allowed={"type", "code"})
    icmp_type = sub.int("type", lo=0, hi=254)
    code = sub.int("code", lo=0, hi=255)
    if code is not None and icmp_type is None:
        sub.fail("code", "an ICMP code needs an ICMP type")
    return ICMPMatch(icmp_type, code)


RULE_FIELDS = frozenset({"action", "ipVersion", "protocol", "notProtocol", "icmp", "notICMP",
                         "source", "destination", "http", "metadata"})


def _check_rule_metadata(fields: Fields) -> None:
    if fields.has("metadata"):
        meta = fields.sub("metadata", allowed={"annotations"})
        meta.str_map("annotations")


def _version(normalised_net: str) -> int:
    return 6 if ":" in normalised_net else 4


def _check_ip_versions(fields: Fields, ip_version: int | None, protocol: int | None,
                       not_protocol: int | None, source: EntityRule,
                       destination: EntityRule) -> None:
    for proto, key in ((protocol, "protocol"), (not_protocol, "notProtocol")):
        if proto == PROTO_ICMP and ip_version not in (None, 4):
            fields.fail("ipVersion", f"must be 4 with {key} ICMP")
        if proto == PROTO_ICMPV6 and ip_version not in (None, 6):
            fields.fail("ipVersion", f"must be 6 with {key} ICMPv6")
    seen: set[int] = set()
    for side, entity in (("source", source), ("destination", destination)):
        for key, nets in (("nets", entity.nets), ("notNets", entity.not_nets)):
            versions = {_version(n) for n in nets}
            if ip_version is not None and versions - {ip_version}:
                fields.fail(f"{side}.{key}", f"rule ipVersion is {ip_version} but a CIDR "
                            "here is not")
            seen |= versions
            if len(seen) > 1:
                fields.fail(f"{side}.{key}", "a rule cannot mix IPv4 and IPv6 CIDRs")


def parse_rule(fields: Fields) -> Rule:
    fields.only(RULE_FIELDS)
    if fields.has("http"):
        fields.fail("http", "HTTP matches need an L7 proxy; pyfelix does not support them")
    _check_rule_metadata(fields)
    action = fields.str("action", required=True)
    if action not in ACTIONS:
        fields.fail("action", f"{action[:40]!r} is not one of {', '.join(ACTIONS)}")
    ip_version = fields.int("ipVersion")
    if ip_version not in (None, 4, 6):
        fields.fail("ipVersion", f"{ip_version} is not 4 or 6")
    protocol = protocol_number(fields.raw("protocol"), fields, "protocol")
    not_protocol = protocol_number(fields.raw("notProtocol"), fields, "notProtocol")
    icmp = _parse_icmp(fields, "icmp")
    not_icmp = _parse_icmp(fields, "notICMP")
    for key, match in (("icmp", icmp), ("notICMP", not_icmp)):
        if match is not None and protocol not in ICMP_PROTOCOLS:
            fields.fail(key, "rules that specify ICMP fields need protocol ICMP or ICMPv6")
    source = parse_entity(fields.sub("source"))
    destination = parse_entity(fields.sub("destination"))
    for side, entity in (("source", source), ("destination", destination)):
        for key, ports in (("ports", entity.ports), ("notPorts", entity.not_ports)):
            if ports and protocol not in PROTOCOLS_WITH_PORTS:
                fields.fail(f"{side}.{key}",
                            "rules that specify ports need protocol TCP, UDP, SCTP or UDPLite")
    _check_ip_versions(fields, ip_version, protocol, not_protocol, source, destination)
    return Rule(action, ip_version, protocol, not_protocol, icmp, not_icmp, source, destination)


def parse_rules(fields: Fields, key: str) -> tuple[Rule, ...]:
    return tuple(parse_rule(item) for item in fields.items(key))


_ENTITY_SELECTOR_FIELDS = ("selector", "notSelector", "namespaceSelector")


def _add_text(found: dict[str, str], mapping: Any, key: str, path: str) -> None:
    value = mapping.get(key) if isinstance(mapping, dict) else None
    if isinstance(value, str):
        found.setdefault(value, path)


def check_selector_text(spec: Fields, own: tuple[str, ...] = ()) -> None:
    """Selector sizes of a policy or profile, on the raw document, before any selector is
    parsed (agent.inputs.LIMITS): each of its own (fields `own` of `spec`) and its rules'
    at most max_selector_length, the distinct ones together at most
    max_selector_text_per_policy (a selector used twice is parsed once, so counts once)."""
    found: dict[str, str] = {}  # text -> field where first seen
    for key in own:
        _add_text(found, spec.data, key, key)
    for rules_key in ("ingress", "egress"):
        for i, rule in enumerate(spec.list(rules_key)):
            if not isinstance(rule, dict):
                continue
            for side in ("source", "destination"):
                entity = rule.get(side)
                where = f"{rules_key}[{i}].{side}"
                for key in _ENTITY_SELECTOR_FIELDS:
                    _add_text(found, entity, key, f"{where}.{key}")
                if isinstance(entity, dict):
                    _add_text(found, entity.get("serviceAccounts"), "selector",
                              f"{where}.serviceAccounts.selector")
    for text, where in found.items():
        if len(text) > LIMITS.max_selector_length:
            _selector_too_long(spec, where, text)
    check_selector_total(spec, sum(len(text) for text in found))


def _selector_too_long(fields: Fields, key: str, text: str) -> NoReturn:
    fields.fail(key, f"the selector is {len(text)} characters, more than "
                f"max_selector_length ({LIMITS.max_selector_length})")


def check_selector_total(fields: Fields, total: int) -> None:
    if total > LIMITS.max_selector_text_per_policy:
        fields.fail("", f"its selectors hold {total} characters in all, more than "
                    f"max_selector_text_per_policy ({LIMITS.max_selector_text_per_policy})")


def check_rule_count(fields: Fields, count: int, key: str = "ingress") -> None:
    """At most max_rules_per_policy rules (agent.inputs.LIMITS) in one policy or profile,
    checked before any rule is parsed."""
    if count > LIMITS.max_rules_per_policy:
        fields.fail(key, f"{count} rules in all, more than max_rules_per_policy "
                    f"({LIMITS.max_rules_per_policy})")


__all__ = [
    "ACTIONS",
    "PROTOCOLS_WITH_PORTS",
    "PROTOCOL_NAMES",
    "PROTOCOL_NUMBERS",
    "RULE_FIELDS",
    "EntityRule",
    "ICMPMatch",
    "Port",
    "Rule",
    "ServiceAccountMatch",
    "cached_network",
    "check_rule_count",
    "check_selector_text",
    "check_selector_total",
    "checked_int",
    "normalise_ip",
    "parse_net",
    "parse_network",
    "parse_port",
    "parse_rule",
    "parse_rules",
    "parse_selector",
]
