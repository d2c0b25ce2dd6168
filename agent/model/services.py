"""Kubernetes Services (`v1 Service`) and `discovery.k8s.io/v1 EndpointSlice`, typed and
validated: the inputs of the BPF dataplane's service load balancing (docs/ARCHITECTURE.md
section 3; the calc graph's `ServiceIndex` turns them into frontend -> backend updates).

Inputs: the whole document as `Fields`, as kubectl writes it (or the API server returns
it). Outputs: frozen `Service` / `EndpointSlice`, or `ValidationError` naming the resource
and field.

Strictness: as for the other Kubernetes kinds, only the fields read here are checked (API
objects carry many more); what is read is checked as the API server checks it:
- Service: name a DNS-1035 label; `type` ClusterIP (default), NodePort, LoadBalancer or
  ExternalName; `clusterIP` an address, "None" (headless) or empty (unallocated) and, when
  `clusterIPs` is given, its first entry; ports: protocol TCP (default), UDP or SCTP, port
  1-65535, `targetPort` a number 1-65535 or a port name (default: `port`), `nodePort`
  0-65535 (0: none), names unique and required when there are several ports; `selector` a
  label map; `sessionAffinity` None (default) or ClientIP with
  `sessionAffinityConfig.clientIP.timeoutSeconds` 1-86400 (default 10800, three hours);
  external/internal traffic policy Cluster (default) or Local; `externalIPs` and
  `status.loadBalancer.ingress[].ip` addresses.
- EndpointSlice: `addressType` IPv4, IPv6 or FQDN; endpoints with 1-100 addresses each
  (checked as the addressType says; FQDN slices are kept but have no usable addresses),
  `conditions` ready / serving / terminating (ready unset counts as ready, as Kubernetes
  documents), `nodeName`; ports with protocol, port 1-65535 (unset: all ports; pyfelix
  skips such a port) and a name; the owning Service from the label
  `kubernetes.io/service-name` (required: a slice without it belongs to no Service).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyfelix.agent.model.base import Metadata, Resource, ip_address_field
from pyfelix.agent.model.fields import Fields
from pyfelix.agent.model.names import is_dns_subdomain, is_port_name
from pyfelix.agent.syncer.api import ResourceKey

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
DEFAULT_AFFINITY_TIMEOUT = 10800  # seconds, Kubernetes' default for ClientIP affinity
MAX_AFFINITY_TIMEOUT = 86400
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
SERVICE_PROTOCOLS = {"TCP": 6, "UDP": 17, "SCTP": 132}
_DNS1035_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # fullmatch only


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    protocol: int  # IP protocol number
    port: int
    target_port: int | str  # a number or a container port name
    node_port: int = 0


@dataclass(frozen=True, slots=True)
class Service(Resource):
    type: str = "ClusterIP"
    cluster_ips: tuple[str, ...] = ()  # empty: headless or not allocated
    ports: tuple[ServicePort, ...] = ()
    selector: tuple[tuple[str, str], ...] | None = None  # None: no selector (manual slices)
    session_affinity: str = "None"
    affinity_timeout: int = DEFAULT_AFFINITY_TIMEOUT
    external_ips: tuple[str, ...] = ()
    load_balancer_ips: tuple[str, ...] = ()
    external_traffic_local: bool = False
    internal_traffic_local: bool = False

    @property
    def client_ip_affinity(self) -> bool:
        return self.session_affinity == "ClientIP"


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    addresses: tuple[str, ...]
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node_name: str = ""


@dataclass(frozen=True, slots=True)
class SlicePort:
    name: str
    protocol: int
    port: int


@dataclass(frozen=True, slots=True)
class EndpointSlice(Resource):
    service_name: str = ""
    address_type: str = "IPv4"
    endpoints: tuple[SliceEndpoint, ...] = ()
    ports: tuple[SlicePort, ...] = ()


def _protocol(fields: Fields, key: str = "protocol") -> int:
    name = fields.one_of(key, tuple(SERVICE_PROTOCOLS), "TCP")
    return SERVICE_PROTOCOLS[name]


def _service_ports(spec: Fields) -> tuple[ServicePort, ...]:
    ports: list[ServicePort] = []
    items = list(spec.items("ports"))
    seen_names: set[str] = set()
    seen_ports: set[tuple[int, int]] = set()
    for item in items:
        name = item.str("name")
        if name and not is_port_name(name):
            item.fail("name", f"{name[:40]!r} is not a valid port name")
        if len(items) > 1 and not name:
            item.fail("name", "required when a Service has several ports")
        if name in seen_names:
            item.fail("name", f"duplicate port name {name[:40]!r}")
        seen_names.add(name)
        protocol = _protocol(item)
        port = item.int("port", lo=1, hi=65535)
        if port is None:
            item.fail("port", "required field is missing")
        if (protocol, port) in seen_ports:
            item.fail("port", f"duplicate port {port} for its protocol")
        seen_ports.add((protocol, port))
        raw_target = item.raw("targetPort")
        target: int | str
        if isinstance(raw_target, str) and raw_target and not raw_target.strip().isdigit():
            if not is_port_name(raw_target):
                item.fail("targetPort", f"{raw_target[:40]!r} is not a port number or name")
            target = raw_target
        else:
            number = item.int("targetPort", lo=1, hi=65535)
            target = port if number is None else number
        node_port = item.int("nodePort", 0, lo=0, hi=65535) or 0
        ports.append(ServicePort(name, protocol, port, target, node_port))
    return tuple(ports)


def parse_service(top: Fields, key: ResourceKey, meta: Metadata) -> Service:
    if not _DNS1035_RE.fullmatch(key.name) or len(key.name) > 63:
        top.sub("metadata").fail("name", f"{key.name[:80]!r} is not a valid Service name: "
                                 "expected a DNS-1035 label (a lower case letter, then "
                                 "letters, digits and '-')")
    spec = top.sub("spec")
    service_type = spec.one_of("type", SERVICE_TYPES, "ClusterIP")
    cluster_ip = spec.str("clusterIP")
    listed = spec.str_list("clusterIPs")
    if listed and cluster_ip and listed[0] != cluster_ip:
        spec.fail("clusterIPs[0]", f"{listed[0][:60]!r} must equal clusterIP {cluster_ip[:60]!r}")
    texts = listed or ((cluster_ip,) if cluster_ip else ())
    cluster_ips: tuple[str, ...] = ()
    if texts and texts[0] != "None":
        cluster_ips = tuple(ip_address_field(t, spec, f"clusterIPs[{i}]" if listed
                                             else "clusterIP") for i, t in enumerate(texts))
    selector = spec.labels("selector") if spec.has("selector") else None
    affinity = spec.one_of("sessionAffinity", ("None", "ClientIP"), "None")
    timeout = DEFAULT_AFFINITY_TIMEOUT
    if affinity == "ClientIP":
        client_ip = spec.sub("sessionAffinityConfig").sub("clientIP")
        timeout = client_ip.int("timeoutSeconds", DEFAULT_AFFINITY_TIMEOUT, lo=1,
                                hi=MAX_AFFINITY_TIMEOUT) or DEFAULT_AFFINITY_TIMEOUT
    external_local = spec.one_of("externalTrafficPolicy", ("Cluster", "Local"),
                                 "Cluster") == "Local"
    internal_local = spec.one_of("internalTrafficPolicy", ("Cluster", "Local"),
                                 "Cluster") == "Local"
    external_ips = tuple(ip_address_field(t, spec, f"externalIPs[{i}]")
                         for i, t in enumerate(spec.list("externalIPs")))
    ingress = top.sub("status").sub("loadBalancer")
    lb_ips = tuple(ip_address_field(item.raw("ip"), item, "ip")
                   for item in ingress.items("ingress") if item.has("ip"))
    return Service(key, meta, type=service_type, cluster_ips=cluster_ips,
                   ports=_service_ports(spec),
                   selector=tuple(sorted(selector.items())) if selector is not None else None,
                   session_affinity=affinity, affinity_timeout=timeout,
                   external_ips=external_ips, load_balancer_ips=lb_ips,
                   external_traffic_local=external_local, internal_traffic_local=internal_local)


def _slice_endpoint(item: Fields, address_type: str) -> SliceEndpoint:
    addresses = item.str_list("addresses")
    if not 1 <= len(addresses) <= 100:
        item.fail("addresses", f"needs 1 to 100 addresses, has {len(addresses)}")
    if address_type == "FQDN":
        checked: tuple[str, ...] = ()
    else:
        checked = tuple(ip_address_field(a, item, f"addresses[{i}]")
                        for i, a in enumerate(addresses))
        wanted = 4 if address_type == "IPv4" else 6
        for i, address in enumerate(checked):
            if (":" in address) != (wanted == 6):
                item.fail(f"addresses[{i}]", f"{address} is not an {address_type} address")
    conditions = item.sub("conditions")
    node = item.str("nodeName")
    if node and not is_dns_subdomain(node):
        item.fail("nodeName", f"{node[:80]!r} is not a valid node name")
    ready = conditions.bool("ready", True)
    return SliceEndpoint(checked, ready=ready, serving=conditions.bool("serving", ready),
                         terminating=conditions.bool("terminating", False), node_name=node)


def parse_endpoint_slice(top: Fields, key: ResourceKey, meta: Metadata) -> EndpointSlice:
    service = meta.labels_dict.get(SERVICE_NAME_LABEL, "")
    if not service:
        top.sub("metadata").fail(f"labels.{SERVICE_NAME_LABEL}",
                                 "required: the Service this slice belongs to")
    address_type = top.one_of("addressType", ("IPv4", "IPv6", "FQDN"), "")
    endpoints = tuple(_slice_endpoint(item, address_type) for item in top.items("endpoints"))
    ports = []
    for item in top.items("ports"):
        name = item.str("name")
        if name and not is_port_name(name):
            item.fail("name", f"{name[:40]!r} is not a valid port name")
        port = item.int("port", 0, lo=1, hi=65535) or 0
        ports.append(SlicePort(name, _protocol(item), port))
    return EndpointSlice(key, meta, service_name=service, address_type=address_type,
                         endpoints=endpoints, ports=tuple(ports))
