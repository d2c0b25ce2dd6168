"""Lab scenario files: parse and validate the lab's scenario format.

Role: turn one YAML document (nodes, namespaces, pods, resources, probes or steps) into an
immutable `Scenario` that the lab runner builds and probes.

Inputs: a file path (`load_scenario`) or already-loaded YAML data (`parse_scenario`).
Outputs: `Scenario` with defaults filled in: nodes default to `[node1]`, a pod's node to the
first node, a pod's IP is allocated from 10.65.0.0/16 when absent (in pod order, skipping
explicit addresses), protocols default to TCP, named probe ports are resolved against the
target pod. A pod's `ip:` may be IPv6: that is its address under --ip-family ipv6 / dual
(its IPv4 `ip` is then allocated). Everything else is parsed in the lab's IPv4 plan;
`lab.family.apply_ip_family` prepares the parsed scenario for --ip-family ipv6 / dual
(`PodSpec.ipv6`, `has_ipv4`, `ProbeSpec.family`, `Scenario.ip_family`). Probe sources: a
pod, `node/NAME` (a host-networked client in that node's namespace) or `external` (the
underlay's own namespace, EXTERNAL_CLIENT_IP, which runs no agent); targets: a pod, an
IPv4 address, or `node/NAME` (that node's underlay address, for NodePorts). `resources` +
`probes` become a single step 0, so consumers only see `steps`.

Invariants:
- Resources (top level and in steps) stay raw dicts: the datastore and the resource model
  interpret them; here we only check each is a mapping with `kind` and `metadata.name`.
- Every problem is reported with its field path (`pods[2].namespace: missing`), all problems
  of a file at once, in one `ScenarioError` (a `ValueError`); nothing else escapes.

Easy to get wrong: YAML turns `labels: {v: 1}` into an int and `expect: no` into False; both
are errors here rather than silently stringified, because Kubernetes would reject them too.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_NODES = ("node1",)
DEFAULT_POD_POOL = ipaddress.IPv4Network("10.65.0.0/16")
UNDERLAY_NETWORK = ipaddress.IPv4Network("198.18.0.0/15")
POD_GATEWAY = ipaddress.IPv4Address("169.254.1.1")
PROTOCOLS = ("TCP", "UDP")
EXPECTATIONS = ("allow", "deny")
EXTERNAL_SOURCE = "external"  # probe source: a client on the underlay, outside every node
NODE_PREFIX = "node/"  # probe source or target `node/NAME`
# the external client's address, on the underlay's bridge (nodes are .0.1, .0.2, ...)
EXTERNAL_CLIENT_IP = ipaddress.IPv4Interface("198.19.255.254/15")


def node_underlay_ip(node_index: int) -> ipaddress.IPv4Address:
    """The underlay address of the scenario's node number `node_index` (0-based)."""
    return UNDERLAY_NETWORK.network_address + node_index + 1

# Kubernetes object names (RFC 1123 labels/subdomains); also safe in netns file names.
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
# Kubernetes port names (IANA_SVC_NAME): at most 15 chars, lowercase alnum and '-'.
_PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$")

_TOP_LEVEL_KEYS = {"name", "nodes", "namespaces", "pods", "resources", "probes", "steps"}
_NAMESPACE_KEYS = {"name", "labels"}
_POD_KEYS = {"namespace", "name", "node", "ip", "labels", "ports", "floatingIPs"}
_PORT_KEYS = {"port", "protocol", "name"}
_PROBE_KEYS = {"from", "to", "port", "protocol", "expect"}
_STEP_KEYS = {"apply", "delete", "probes"}
_REF_KEYS = {"kind", "namespace", "name"}


class ScenarioError(ValueError):
    """A scenario is malformed; `problems` lists every `field.path: message` found."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"invalid scenario {source}:\n{lines}")


@dataclass(frozen=True)
class PortSpec:
    port: int
    protocol: str
    name: str | None = None


@dataclass(frozen=True)
class NamespaceSpec:
    name: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PodSpec:
    namespace: str
    name: str
    node: str
    ip: ipaddress.IPv4Address
    labels: dict[str, str] = field(default_factory=dict)
    ports: tuple[PortSpec, ...] = ()
    # Calico's `cni.projectcalico.org/floatingIPs` annotation: addresses NATed to the pod
    # (IPv4 as written; `lab.family` adds or substitutes their IPv6 twins)
    floating_ips: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...] = ()
    # `lab.family`: the IPv6 address (the lab's mapping of `ip`) under --ip-family ipv6/dual,
    # and whether the pod has `ip` itself (not under ipv6, where `ip` only names the pod's
    # place in the lab's IPv4 plan the IPv6 address is derived from)
    ipv6: ipaddress.IPv6Address | None = None
    has_ipv4: bool = True
    # an IPv6 `ip:` as written (then `ip` is allocated from the pool): the pod's IPv6
    # address under --ip-family ipv6 / dual instead of the twin of `ip`
    ipv6_given: ipaddress.IPv6Address | None = None

    @property
    def key(self) -> str:
        """`namespace/name`, the form probes use."""
        return f"{self.namespace}/{self.name}"

    @property
    def addresses(self) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]:
        """The addresses the pod really has: IPv4 first, then IPv6."""
        v4 = (self.ip,) if self.has_ipv4 else ()
        return v4 + ((self.ipv6,) if self.ipv6 is not None else ())

    def address(self, family: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        """The pod's address of IP version `family` (4 or 6), None when it has none."""
        return next((a for a in self.addresses if a.version == family), None)


@dataclass(frozen=True)
class ProbeSpec:
    """One connection attempt: from a pod to a pod (`target` = its key) or to a bare IP."""

    source: str
    target: str
    target_ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    protocol: str
    expect: str | None = None

    @property
    def family(self) -> int:
        """IP version the probe runs over (4 or 6): its target address's."""
        return self.target_ip.version


@dataclass(frozen=True)
class ResourceRef:
    kind: str
    name: str
    namespace: str | None = None


@dataclass(frozen=True)
class Step:
    apply: tuple[dict[str, Any], ...] = ()
    delete: tuple[ResourceRef, ...] = ()
    probes: tuple[ProbeSpec, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: tuple[str, ...]
    namespaces: tuple[NamespaceSpec, ...]
    pods: tuple[PodSpec, ...]
    steps: tuple[Step, ...]
    # The top-level `resources` as written (also step 0's `apply` when `steps` is absent).
    resources: tuple[dict[str, Any], ...] = ()
    # --ip-family the scenario was prepared for (`lab.family.apply_ip_family`)
    ip_family: str = "ipv4"

    def pod(self, key: str) -> PodSpec:
        for pod in self.pods:
            if pod.key == key:
                return pod
        raise KeyError(key)

    def pods_on(self, node: str) -> tuple[PodSpec, ...]:
        return tuple(p for p in self.pods if p.node == node)

    @property
    def probes(self) -> tuple[ProbeSpec, ...]:
        return tuple(p for step in self.steps for p in step.probes)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raises `ScenarioError` naming the file."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(source, [f"cannot read file: {exc.strerror or exc}"]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(source, [f"not valid YAML: {exc}"]) from exc
    return parse_scenario(data, source=source, default_name=path.stem)


def parse_scenario(
    data: object, *, source: str = "<scenario>", default_name: str = "scenario"
) -> Scenario:
    """Validate loaded YAML data; raises `ScenarioError` listing every problem."""
    parser = _ScenarioParser(source)
    scenario = parser.parse(data, default_name)
    if parser.problems or scenario is None:
        raise ScenarioError(source, parser.problems or ["empty scenario"])
    return scenario


class _ScenarioParser:
    """Walks the document once, collecting problems instead of stopping at the first."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []
        self.nodes: tuple[str, ...] = DEFAULT_NODES

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    # --- top level ---------------------------------------------------------------------

    def parse(self, data: object, default_name: str) -> Scenario | None:
        if not isinstance(data, Mapping):
            self.fail("(top level)", f"must be a mapping, got {_type_name(data)}")
            return None
        self.check_keys(data, _TOP_LEVEL_KEYS, "")
        name = self.optional_str(data, "name", "name") or default_name
        nodes = self.parse_nodes(data.get("nodes"))
        self.nodes = nodes
        namespaces = self.parse_namespaces(data.get("namespaces"))
        pods = self.parse_pods(data.get("pods"), nodes, {ns.name for ns in namespaces})
        pods_by_key = {p.key: p for p in pods}
        resources = self.parse_documents(data.get("resources"), "resources")
        if "steps" in data:
            if "resources" in data or "probes" in data:
                self.fail("steps", "use either steps or top-level resources+probes, not both")
            steps = self.parse_steps(data["steps"], pods_by_key)
        else:
            probes = self.parse_probes(data.get("probes"), "probes", pods_by_key)
            steps = (Step(apply=resources, probes=probes),)
        return Scenario(
            name=name,
            nodes=nodes,
            namespaces=namespaces,
            pods=pods,
            steps=steps,
            resources=resources,
        )

    def parse_nodes(self, raw: object) -> tuple[str, ...]:
        if raw is None:
            return DEFAULT_NODES
        items = self.list_of(raw, "nodes")
        if not items:
            self.fail("nodes", "must list at least one node")
            return DEFAULT_NODES
        nodes: list[str] = []
        for i, item in enumerate(items):
            path = f"nodes[{i}]"
            if not self.dns_name(item, path):
                continue
            if item in nodes:
                self.fail(path, f"duplicate node {item!r}")
                continue
            nodes.append(item)
        return tuple(nodes) or DEFAULT_NODES

    def parse_namespaces(self, raw: object) -> tuple[NamespaceSpec, ...]:
        namespaces: list[NamespaceSpec] = []
        for i, item in enumerate(self.list_of(raw, "namespaces")):
            path = f"namespaces[{i}]"
            if not self.mapping(item, path):
                continue
            self.check_keys(item, _NAMESPACE_KEYS, path)
            name = self.required_dns_name(item, "name", path)
            labels = self.labels(item.get("labels"), f"{path}.labels")
            if name is None:
                continue
            if any(ns.name == name for ns in namespaces):
                self.fail(f"{path}.name", f"duplicate namespace {name!r}")
                continue
            namespaces.append(NamespaceSpec(name=name, labels=labels))
        return tuple(namespaces)

    # --- pods ------------------------------------------------------------------------------

    def parse_pods(
        self, raw: object, nodes: tuple[str, ...], namespaces: set[str]
    ) -> tuple[PodSpec, ...]:
        items = self.list_of(raw, "pods")
        explicit_ips, explicit_ipv6 = self.explicit_pod_ips(items)
        allocator = _PodIPAllocator(DEFAULT_POD_POOL, reserved=set(explicit_ips.values()))
        pods: list[PodSpec] = []
        seen_keys: set[str] = set()
        for i, item in enumerate(items):
            path = f"pods[{i}]"
            if not self.mapping(item, path):
                continue
            self.check_keys(item, _POD_KEYS, path)
            namespace = self.required_dns_name(item, "namespace", path)
            if namespace is not None and namespace not in namespaces:
                self.fail(f"{path}.namespace", f"{namespace!r} is not declared in namespaces")
            name = self.required_dns_name(item, "name", path)
            node = nodes[0]
            if "node" in item:
                node_value = item["node"]
                if node_value in nodes:
                    node = node_value
                else:
                    self.fail(f"{path}.node", f"{node_value!r} is not one of nodes {list(nodes)}")
            ip = explicit_ips.get(i) if "ip" in item and i not in explicit_ipv6 \
                else allocator.next(path, self)
            labels = self.labels(item.get("labels"), f"{path}.labels")
            ports = self.parse_ports(item.get("ports"), f"{path}.ports")
            floating = item.get("floatingIPs", [])
            if not isinstance(floating, list):
                self.fail(f"{path}.floatingIPs", "must be a list of IPv4 addresses")
                floating = []
            parsed = [self.ipv4(raw, f"{path}.floatingIPs[{j}]")
                      for j, raw in enumerate(floating)]
            floating_ips = tuple(address for address in parsed if address is not None)
            if namespace is None or name is None or ip is None:
                continue
            key = f"{namespace}/{name}"
            if key in seen_keys:
                self.fail(path, f"duplicate pod {key!r}")
                continue
            seen_keys.add(key)
            pods.append(PodSpec(namespace, name, node, ip, labels, ports, floating_ips,
                                ipv6_given=explicit_ipv6.get(i)))
        return tuple(pods)

    def explicit_pod_ips(self, items: list[Any]) -> tuple[dict[int, ipaddress.IPv4Address],
                                                         dict[int, ipaddress.IPv6Address]]:
        """Validate every explicit pod IP first, so allocation can skip all of them.
        IPv6 ones (used under --ip-family ipv6 / dual, `lab.family`) are returned apart."""
        found: dict[int, ipaddress.IPv4Address] = {}
        found6: dict[int, ipaddress.IPv6Address] = {}
        owners: dict[ipaddress.IPv4Address | ipaddress.IPv6Address, int] = {}
        for i, item in enumerate(items):
            if not isinstance(item, Mapping) or "ip" not in item:
                continue
            path = f"pods[{i}].ip"
            ip6 = _ipv6_or_none(item["ip"])
            if ip6 is not None:
                if ip6 in owners:
                    self.fail(path, f"{ip6} is already used by pods[{owners[ip6]}]")
                elif (ip6.is_link_local or ip6.is_multicast or ip6.is_unspecified
                      or ip6.is_loopback or ip6.ipv4_mapped is not None):
                    self.fail(path, f"{ip6} is not a unicast address a pod can have")
                else:
                    owners[ip6] = i
                    found6[i] = ip6
                continue
            ip = self.ipv4(item["ip"], path)
            if ip is None:
                continue
            if ip in owners:
                self.fail(path, f"{ip} is already used by pods[{owners[ip]}]")
                continue
            if ip in UNDERLAY_NETWORK or ip == POD_GATEWAY or not _usable_pod_ip(ip):
                self.fail(path, f"{ip} is reserved (underlay, gateway or non-unicast)")
                continue
            owners[ip] = i
            found[i] = ip
        return found, found6

    def parse_ports(self, raw: object, path: str) -> tuple[PortSpec, ...]:
        ports: list[PortSpec] = []
        for i, item in enumerate(self.list_of(raw, path)):
            item_path = f"{path}[{i}]"
            if not self.mapping(item, item_path):
                continue
            self.check_keys(item, _PORT_KEYS, item_path)
            port = self.port_number(item.get("port"), f"{item_path}.port")
            protocol = self.protocol(item.get("protocol", "TCP"), f"{item_path}.protocol")
            name = item.get("name")
            if name is not None and not (isinstance(name, str) and _PORT_NAME.fullmatch(name)):
                self.fail(
                    f"{item_path}.name",
                    f"{name!r} is not a port name (lowercase letters, digits and '-', "
                    "at most 15 characters)",
                )
                name = None
            if port is None or protocol is None:
                continue
            if any(p.port == port and p.protocol == protocol for p in ports):
                self.fail(item_path, f"duplicate port {port}/{protocol}")
                continue
            if name is not None and any(p.name == name for p in ports):
                self.fail(f"{item_path}.name", f"duplicate port name {name!r}")
                continue
            ports.append(PortSpec(port=port, protocol=protocol, name=name))
        return tuple(ports)

    # --- probes, steps, documents ----------------------------------------------------------

    def parse_probes(
        self, raw: object, path: str, pods: dict[str, PodSpec]
    ) -> tuple[ProbeSpec, ...]:
        probes: list[ProbeSpec] = []
        for i, item in enumerate(self.list_of(raw, path)):
            probe = self.parse_probe(item, f"{path}[{i}]", pods)
            if probe is not None:
                probes.append(probe)
        return tuple(probes)

    def parse_probe(self, item: object, path: str, pods: dict[str, PodSpec]) -> ProbeSpec | None:
        if not self.mapping(item, path):
            return None
        self.check_keys(item, _PROBE_KEYS, path)
        source = item.get("from")
        if source is None:
            self.fail(f"{path}.from", "missing")
        elif source not in pods and source != EXTERNAL_SOURCE and not self.is_node_ref(source):
            self.fail(f"{path}.from", f"{source!r} is not a pod (use namespace/name), "
                      f"node/NAME of a scenario node, or {EXTERNAL_SOURCE!r}")
            source = None
        target, target_pod, target_ip = self.probe_target(item.get("to"), f"{path}.to", pods)
        protocol = self.protocol(item.get("protocol", "TCP"), f"{path}.protocol")
        port = self.probe_port(item.get("port"), f"{path}.port", target_pod, protocol)
        expect = item.get("expect")
        if expect is not None and expect not in EXPECTATIONS:
            self.fail(f"{path}.expect", f"{expect!r} is not one of {list(EXPECTATIONS)}")
            expect = None
        if None in (source, target, target_ip, protocol, port):
            return None
        return ProbeSpec(
            source=str(source),
            target=str(target),
            target_ip=target_ip,  # type: ignore[arg-type]
            port=port,  # type: ignore[arg-type]
            protocol=str(protocol),
            expect=expect,
        )

    def probe_target(
        self, raw: object, path: str, pods: dict[str, PodSpec]
    ) -> tuple[str | None, PodSpec | None, ipaddress.IPv4Address | None]:
        if raw is None:
            self.fail(path, "missing")
            return None, None, None
        if isinstance(raw, str) and raw in pods:
            pod = pods[raw]
            return raw, pod, pod.ip
        if self.is_node_ref(raw):
            return str(raw), None, node_underlay_ip(self.nodes.index(str(raw)[len(NODE_PREFIX):]))
        try:
            ip = ipaddress.ip_address(str(raw))
        except ValueError:
            self.fail(path, f"{raw!r} is neither a pod (namespace/name), node/NAME of a "
                      "scenario node, nor an IPv4 address")
            return None, None, None
        if not isinstance(ip, ipaddress.IPv4Address):
            self.fail(path, f"{raw!r}: only IPv4 targets are supported")
            return None, None, None
        return str(ip), None, ip

    def is_node_ref(self, raw: object) -> bool:
        """`node/NAME` naming one of the scenario's nodes?"""
        return (isinstance(raw, str) and raw.startswith(NODE_PREFIX)
                and raw[len(NODE_PREFIX):] in self.nodes)

    def probe_port(
        self, raw: object, path: str, target: PodSpec | None, protocol: str | None
    ) -> int | None:
        if isinstance(raw, str) and not raw.isdigit():
            if target is None:
                self.fail(path, f"named port {raw!r} needs a pod target")
                return None
            for port in target.ports:
                if port.name == raw and (protocol is None or port.protocol == protocol):
                    return port.port
            self.fail(path, f"pod {target.key} has no {protocol or ''} port named {raw!r}")
            return None
        return self.port_number(raw, path)

    def parse_steps(self, raw: object, pods: dict[str, PodSpec]) -> tuple[Step, ...]:
        steps: list[Step] = []
        items = self.list_of(raw, "steps")
        if raw is not None and not items:
            self.fail("steps", "must list at least one step")
        for i, item in enumerate(items):
            path = f"steps[{i}]"
            if not self.mapping(item, path):
                continue
            self.check_keys(item, _STEP_KEYS, path)
            if not any(key in item for key in _STEP_KEYS):
                self.fail(path, "needs at least one of apply, delete, probes")
            steps.append(
                Step(
                    apply=self.parse_documents(item.get("apply"), f"{path}.apply"),
                    delete=self.parse_refs(item.get("delete"), f"{path}.delete"),
                    probes=self.parse_probes(item.get("probes"), f"{path}.probes", pods),
                )
            )
        return tuple(steps)

    def parse_documents(self, raw: object, path: str) -> tuple[dict[str, Any], ...]:
        documents: list[dict[str, Any]] = []
        for i, item in enumerate(self.list_of(raw, path)):
            item_path = f"{path}[{i}]"
            if not self.mapping(item, item_path):
                continue
            kind = item.get("kind")
            if not isinstance(kind, str) or not kind:
                self.fail(f"{item_path}.kind", "missing" if kind is None else "must be a string")
                continue
            metadata = item.get("metadata")
            if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
                self.fail(f"{item_path}.metadata.name", f"missing (kind {kind})")
                continue
            documents.append(dict(item))
        return tuple(documents)

    def parse_refs(self, raw: object, path: str) -> tuple[ResourceRef, ...]:
        refs: list[ResourceRef] = []
        for i, item in enumerate(self.list_of(raw, path)):
            item_path = f"{path}[{i}]"
            if not self.mapping(item, item_path):
                continue
            self.check_keys(item, _REF_KEYS, item_path)
            kind = self.required_str(item, "kind", item_path)
            name = self.required_str(item, "name", item_path)
            namespace = self.optional_str(item, "namespace", f"{item_path}.namespace")
            if kind is not None and name is not None:
                refs.append(ResourceRef(kind=kind, name=name, namespace=namespace))
        return tuple(refs)

    # --- field helpers ---------------------------------------------------------------------

    def check_keys(self, item: Mapping[Any, Any], allowed: set[str], path: str) -> None:
        for key in item:
            if key not in allowed:
                where = f"{path}.{key}" if path else str(key)
                self.fail(where, f"unknown field (expected one of {sorted(allowed)})")

    def list_of(self, raw: object, path: str) -> list[Any]:
        if raw is None:
            return []
        if not isinstance(raw, list):
            self.fail(path, f"must be a list, got {_type_name(raw)}")
            return []
        return raw

    def mapping(self, item: object, path: str) -> bool:
        if isinstance(item, Mapping):
            return True
        self.fail(path, f"must be a mapping, got {_type_name(item)}")
        return False

    def required_str(self, item: Mapping[str, Any], key: str, path: str) -> str | None:
        if key not in item or item[key] is None:
            self.fail(f"{path}.{key}", "missing")
            return None
        value = item[key]
        if not isinstance(value, str) or not value:
            self.fail(f"{path}.{key}", f"must be a non-empty string, got {value!r}")
            return None
        return value

    def optional_str(self, item: Mapping[str, Any], key: str, path: str) -> str | None:
        value = item.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.fail(path, f"must be a non-empty string, got {value!r}")
            return None
        return value

    def required_dns_name(self, item: Mapping[str, Any], key: str, path: str) -> str | None:
        value = self.required_str(item, key, path)
        if value is not None and not self.dns_name(value, f"{path}.{key}"):
            return None
        return value

    def dns_name(self, value: object, path: str) -> bool:
        if isinstance(value, str) and _DNS_NAME.fullmatch(value):
            return True
        self.fail(
            path,
            f"{value!r} is not a valid name (lowercase letters, digits, '-' and '.', "
            "at most 63 characters)",
        )
        return False

    def labels(self, raw: object, path: str) -> dict[str, str]:
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            self.fail(path, f"must be a mapping, got {_type_name(raw)}")
            return {}
        labels: dict[str, str] = {}
        for key, value in raw.items():
            if not isinstance(key, str) or not key:
                self.fail(f"{path}.{key}", "label keys must be non-empty strings")
            elif not isinstance(value, str):
                self.fail(
                    f"{path}.{key}",
                    f"value must be a string, got {_type_name(value)} {value!r} (quote it)",
                )
            else:
                labels[key] = value
        return labels

    def port_number(self, raw: object, path: str) -> int | None:
        if raw is None:
            self.fail(path, "missing")
            return None
        if isinstance(raw, str) and raw.isdigit():
            raw = int(raw)
        if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 65535:
            self.fail(path, f"must be a port number 1-65535, got {raw!r}")
            return None
        return raw

    def protocol(self, raw: object, path: str) -> str | None:
        if isinstance(raw, str) and raw.upper() in PROTOCOLS:
            return raw.upper()
        self.fail(path, f"{raw!r} is not one of {list(PROTOCOLS)}")
        return None

    def ipv4(self, raw: object, path: str) -> ipaddress.IPv4Address | None:
        try:
            ip = ipaddress.ip_address(str(raw))
        except ValueError:
            self.fail(path, f"{raw!r} is not an IP address")
            return None
        if not isinstance(ip, ipaddress.IPv4Address):
            self.fail(path, f"{raw!r}: only IPv4 pod addresses are supported")
            return None
        return ip


class _PodIPAllocator:
    """Hands out pool addresses in order, skipping reserved ones; bounded by the pool size."""

    def __init__(
        self, pool: ipaddress.IPv4Network, reserved: set[ipaddress.IPv4Address]
    ) -> None:
        self.pool = pool
        self.reserved = reserved
        self._hosts: Iterator[ipaddress.IPv4Address] = pool.hosts()

    def next(self, path: str, parser: _ScenarioParser) -> ipaddress.IPv4Address | None:
        for ip in self._hosts:
            if ip not in self.reserved:
                self.reserved.add(ip)
                return ip
        parser.fail(f"{path}.ip", f"no free address left in {self.pool}")
        return None


def _ipv6_or_none(raw: object) -> ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(str(raw))
    except ValueError:
        return None
    return ip if isinstance(ip, ipaddress.IPv6Address) else None


def _usable_pod_ip(ip: ipaddress.IPv4Address) -> bool:
    return not (
        ip.is_loopback or ip.is_multicast or ip.is_unspecified or ip.is_reserved
        or ip.is_link_local or ip == ipaddress.IPv4Address("255.255.255.255")
    )


def _type_name(value: object) -> str:
    if value is None:
        return "nothing"
    return {dict: "mapping", list: "list", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )
