"""ServiceIndex: Services + EndpointSlices -> the service frontends of this node.

Role (the part of kube-proxy's service change tracker the BPF dataplane needs; Felix's
BPF mode reads the same objects). Inputs: `Service` and `EndpointSlice` updates from the
dispatcher. Output: `sink.on_service_frontend_update(id, ServiceFrontendUpdate | None)`.

One frontend per (virtual IP, service port, protocol): the Service's cluster IPs, IPv4
and IPv6 (kind "cluster"), its externalIPs and load-balancer ingress IPs (kind "external"), and for
a NodePort or LoadBalancer Service each port's nodePort (kind "nodeport", virtual IP
`proto.NODEPORT_VIP` / `proto.NODEPORT_VIP6`: any of this node's IPv4 / IPv6 addresses;
backends as an external frontend's), one per family of the Service's cluster IPs, as
kube-proxy's per-family proxiers serve a dual-stack Service's NodePort on both (a Service
without cluster IPs: IPv4).
Its backends, per Kubernetes' rules:
- from every EndpointSlice labelled `kubernetes.io/service-name: <service>` in the
  Service's namespace whose addressType is the frontend's family (an IPv4 VIP gets the
  IPv4 slices' endpoints, an IPv6 VIP or NodePort the IPv6 ones); the slice port
  with the Service port's name and protocol gives the target port (a Service port whose
  slices have no such port has no backends);
- ready endpoints only; when there is none, the serving endpoints that are terminating
  (kube-proxy's fallback, so a rollout's last pod keeps answering). A terminating
  endpoint is otherwise not a backend for NEW connections; existing flows to it keep
  working because the dataplane's NAT conntrack entries carry their backend;
- `internalTrafficPolicy: Local` (cluster frontends) and `externalTrafficPolicy: Local`
  (external and nodeport frontends): only endpoints whose `nodeName` is this node (none
  here: the frontend has no backends and its traffic is rejected);
- deduplicated (an address in two slices counts once) and sorted, so the same state
  always yields the same message.
A Service without ready backends still gets its frontend, with no backends: the dataplane
rejects its traffic (kube-proxy's REJECT), it does not time out. Headless Services
(clusterIP None) and ExternalName have no frontend. Two Services claiming the same
frontend: the first by (namespace, name) wins until it goes (logged).

Invariants: output depends only on the current Services and slices; a frontend sent is
removed (None) when nothing produces it any more; an unchanged frontend is not re-sent;
a change to one Service touches only its own frontends.
"""

from __future__ import annotations

import ipaddress
import logging
from collections import defaultdict
from typing import Protocol

from pyfelix.agent import proto
from pyfelix.agent.calc.dispatcher import CalcUpdate, Dispatcher
from pyfelix.agent.model import EndpointSlice, Service, ServicePort
from pyfelix.agent.syncer.api import ResourceKey

log = logging.getLogger(__name__)

KIND_SERVICE = "Service"
KIND_ENDPOINT_SLICE = "EndpointSlice"


class ServiceSink(Protocol):
    def on_service_frontend_update(self, frontend_id: str,
                                   frontend: proto.ServiceFrontendUpdate | None) -> None: ...


def frontend_id(vip: str, port: int, protocol: int) -> str:
    return f"{vip}:{port}/{protocol}"


def _family(text: str) -> int:
    """4 or 6, 0 for text that is not an IP address."""
    try:
        return ipaddress.ip_address(text).version
    except ValueError:
        return 0


def _is_ip(text: str) -> bool:
    return _family(text) != 0


class ServiceIndex:
    def __init__(self, hostname: str, sink: ServiceSink) -> None:
        self._hostname = hostname
        self._sink = sink
        self._services: dict[tuple[str, str], Service] = {}
        self._slices: dict[ResourceKey, EndpointSlice] = {}
        self._slices_by_service: dict[tuple[str, str], set[ResourceKey]] = defaultdict(set)
        # what each service currently produces, and who owns each frontend id
        self._produced: dict[tuple[str, str], dict[str, proto.ServiceFrontendUpdate]] = {}
        self._owners: dict[str, set[tuple[str, str]]] = defaultdict(set)
        self._sent: dict[str, proto.ServiceFrontendUpdate] = {}

    def register_with(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(KIND_SERVICE, self.on_service_update)
        dispatcher.register(KIND_ENDPOINT_SLICE, self.on_slice_update)

    # --- inputs ---------------------------------------------------------------------------

    def on_service_update(self, update: CalcUpdate) -> None:
        name = (update.key.namespace, update.key.name)
        if update.value is None:
            self._services.pop(name, None)
        else:
            self._services[name] = update.value
        self._recalculate(name)

    def on_slice_update(self, update: CalcUpdate) -> None:
        old = self._slices.pop(update.key, None)
        touched = set()
        if old is not None:
            owner = (update.key.namespace, old.service_name)
            self._slices_by_service[owner].discard(update.key)
            if not self._slices_by_service[owner]:
                del self._slices_by_service[owner]
            touched.add(owner)
        if update.value is not None:
            owner = (update.key.namespace, update.value.service_name)
            self._slices[update.key] = update.value
            self._slices_by_service[owner].add(update.key)
            touched.add(owner)
        for name in sorted(touched):
            self._recalculate(name)

    # --- views ----------------------------------------------------------------------------

    def frontends(self) -> dict[str, proto.ServiceFrontendUpdate]:
        return dict(sorted(self._sent.items()))

    # --- calculation ----------------------------------------------------------------------

    def _recalculate(self, name: tuple[str, str]) -> None:
        service = self._services.get(name)
        new = self._frontends_of(name, service) if service is not None else {}
        old = self._produced.pop(name, {})
        if new:
            self._produced[name] = new
        for fid in old.keys() - new.keys():
            self._owners[fid].discard(name)
            if not self._owners[fid]:
                del self._owners[fid]
        for fid in new:
            owners = self._owners[fid]
            if owners and name not in owners:
                log.warning("Services %s and %s/%s both claim frontend %s; the first wins",
                            "/".join(min(owners)), *name, fid)
            owners.add(name)
        for fid in sorted(old.keys() | new.keys()):
            self._resend(fid)

    def _resend(self, fid: str) -> None:
        owners = self._owners.get(fid)
        message = self._produced[min(owners)][fid] if owners else None
        if message is None:
            if self._sent.pop(fid, None) is not None:
                self._sink.on_service_frontend_update(fid, None)
        elif self._sent.get(fid) != message:
            self._sent[fid] = message
            self._sink.on_service_frontend_update(fid, message)

    def _frontends_of(self, name: tuple[str, str], service: Service
                      ) -> dict[str, proto.ServiceFrontendUpdate]:
        if service.type == "ExternalName" or not service.ports:
            return {}
        vips = [(ip, "cluster") for ip in service.cluster_ips if _is_ip(ip)]
        vips += [(ip, "external") for ip in (*service.external_ips, *service.load_balancer_ips)
                 if _is_ip(ip)]
        node_ports = service.type in ("NodePort", "LoadBalancer")
        node_port_families = sorted({_family(ip) for ip in service.cluster_ips
                                     if _is_ip(ip)} or {4}) if node_ports else []
        if not vips and not node_ports:
            return {}
        slices = [self._slices[k] for k in sorted(self._slices_by_service.get(name, ()))]
        out: dict[str, proto.ServiceFrontendUpdate] = {}
        affinity = service.affinity_timeout if service.client_ip_affinity else 0
        for port in service.ports:
            for kind in ("cluster", "external"):
                local_only = (service.internal_traffic_local if kind == "cluster"
                              else service.external_traffic_local)
                backends = self._backends(slices, port, local_only, 4)
                backends6: tuple[proto.ServiceBackend, ...] | None = None
                for vip, vip_kind in vips:
                    if vip_kind != kind:
                        continue
                    if _family(vip) == 6 and backends6 is None:
                        backends6 = self._backends(slices, port, local_only, 6)
                    fid = frontend_id(vip, port.port, port.protocol)
                    out[fid] = proto.ServiceFrontendUpdate(
                        id=fid, service=f"{name[0]}/{name[1]}", port_name=port.name, vip=vip,
                        port=port.port, protocol=port.protocol, kind=kind,
                        backends=backends if _family(vip) == 4 else backends6,
                        affinity_timeout=affinity,
                        traffic_local=local_only)
                if kind != "external" or not port.node_port:
                    continue
                for family in node_port_families:
                    if family == 6 and backends6 is None:
                        backends6 = self._backends(slices, port, local_only, 6)
                    any_vip = proto.NODEPORT_VIP if family == 4 else proto.NODEPORT_VIP6
                    fid = frontend_id(any_vip, port.node_port, port.protocol)
                    out[fid] = proto.ServiceFrontendUpdate(
                        id=fid, service=f"{name[0]}/{name[1]}", port_name=port.name,
                        vip=any_vip, port=port.node_port, protocol=port.protocol,
                        kind="nodeport", backends=backends if family == 4 else backends6,
                        affinity_timeout=affinity, traffic_local=local_only)
        return out

    def _backends(self, slices: list[EndpointSlice], port: ServicePort, local_only: bool,
                  family: int) -> tuple[proto.ServiceBackend, ...]:
        """The backends of `port` from the slices of `family` (addressType IPv4 / IPv6)."""
        ready: set[proto.ServiceBackend] = set()
        terminating: set[proto.ServiceBackend] = set()
        wanted = "IPv4" if family == 4 else "IPv6"
        for eps in slices:
            if eps.address_type != wanted:
                continue
            target = next((p.port for p in eps.ports
                           if p.name == port.name and p.protocol == port.protocol
                           and p.port), 0)
            if not target:
                continue
            for endpoint in eps.endpoints:
                if local_only and endpoint.node_name != self._hostname:
                    continue
                if endpoint.ready:
                    bucket = ready
                elif endpoint.serving and endpoint.terminating:
                    bucket = terminating
                else:
                    continue
                for addr in endpoint.addresses:
                    bucket.add(proto.ServiceBackend(addr, target, endpoint.node_name))
        return tuple(sorted(ready or terminating))
