"""Which Typha servers a client tries, in which order (Calico's Typha discovery).

Role: give `agent.typha.client.TyphaSyncer` a fresh list of "HOST:PORT" addresses before
each round of connection attempts.

- `StaticDiscovery`: an explicit list (`typha://a:5473,b:5473`, or Calico's FELIX_TYPHAADDR),
  in the order given (the operator's preference).
- `KubernetesServiceDiscovery`: the endpoints of a Kubernetes service (Calico's
  FELIX_TYPHAK8SSERVICENAME in FELIX_TYPHAK8SNAMESPACE, default kube-system): from its
  EndpointSlices (discovery.k8s.io/v1, label `kubernetes.io/service-name`), or from the
  older core/v1 Endpoints object when the cluster has no EndpointSlice API. Only ready
  endpoints count (an unset `ready` condition means ready, as the API defines it). The port
  is the one named `port_name` (default: "calico-typha" or "typha"), or the only one. The
  endpoints on this node come first (shortest path, and Typha on hostNetwork survives pod
  networking problems); the others are shuffled so that agents spread over the servers.

Inputs: the Kubernetes API objects are injected (`discovery_api` with
`list_namespaced_endpoint_slice`, `core_api` with `read_namespaced_endpoints`), so tests use
fakes returning real `kubernetes.client` model objects; by default they are built from the
in-cluster config, else KUBECONFIG.

Invariants: addresses are unique, formatted "host:port" ("[v6]:port" for IPv6); every
failure (API error, no ready endpoint, no usable port) raises `DiscoveryError` naming the
service and namespace.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

DEFAULT_NAMESPACE = "kube-system"
DEFAULT_PORT_NAMES = ("calico-typha", "typha")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class DiscoveryError(Exception):
    """No address could be found; the message says where we looked and why."""


class Discovery(Protocol):
    description: str

    def discover(self) -> list[str]:
        """Addresses to try, best first; raises DiscoveryError."""


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_address(address: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port); ValueError naming the address."""
    host, sep, port = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Typha address {address!r} is not HOST:PORT (port 1-65535)")
    return host, int(port)


class StaticDiscovery:
    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise ValueError("StaticDiscovery needs at least one address")
        checked = [format_address(*split_address(a)) for a in addresses]
        self.addresses = list(dict.fromkeys(checked))
        self.description = ", ".join(self.addresses)

    def discover(self) -> list[str]:
        return list(self.addresses)


class KubernetesServiceDiscovery:
    def __init__(self, service_name: str, namespace: str = DEFAULT_NAMESPACE, *,
                 node_name: str, port_name: str | None = None,
                 discovery_api: Any = None, core_api: Any = None,
                 rng: random.Random | None = None) -> None:
        if not service_name:
            raise ValueError("KubernetesServiceDiscovery needs a service name")
        self.service_name = service_name
        self.namespace = namespace or DEFAULT_NAMESPACE
        self.node_name = node_name
        self.port_names = (port_name,) if port_name else DEFAULT_PORT_NAMES
        self._discovery_api = discovery_api
        self._core_api = core_api
        self._rng = rng or random.Random()
        self.description = f"service {self.namespace}/{self.service_name}"

    def discover(self) -> list[str]:
        endpoints = self._endpoints()  # [(address, node name, ready)]
        ready = [(address, node) for address, node, is_ready in endpoints if is_ready]
        if not ready:
            raise DiscoveryError(
                f"{self.description} has no ready endpoint"
                + (f" ({len(endpoints)} not ready)" if endpoints else ""))
        local = list(dict.fromkeys(a for a, node in ready if node == self.node_name))
        remote = list(dict.fromkeys(a for a, node in ready if node != self.node_name
                                    and a not in local))
        self._rng.shuffle(remote)
        return local + remote

    # -- reading the API --

    def _apis(self) -> tuple[Any, Any]:
        if self._discovery_api is None and self._core_api is None:
            from kubernetes import client, config  # heavy: only when discovery is used

            try:
                config.load_incluster_config()
            except config.ConfigException:
                try:
                    config.load_kube_config()
                except (config.ConfigException, OSError) as exc:
                    raise DiscoveryError(f"cannot look up {self.description}: no in-cluster "
                                         f"Kubernetes config and no usable KUBECONFIG "
                                         f"({exc})") from exc
            self._discovery_api = client.DiscoveryV1Api()
            self._core_api = client.CoreV1Api()
        return self._discovery_api, self._core_api

    def _endpoints(self) -> list[tuple[str, str, bool]]:
        discovery_api, core_api = self._apis()
        if discovery_api is not None:
            try:
                slices = discovery_api.list_namespaced_endpoint_slice(
                    self.namespace, label_selector=f"{SERVICE_NAME_LABEL}={self.service_name}")
                return self._from_slices(slices.items or [])
            except DiscoveryError:
                raise
            except Exception as exc:
                if _status(exc) != 404 or core_api is None:
                    raise DiscoveryError(f"cannot list the EndpointSlices of "
                                         f"{self.description}: {_reason(exc)}") from exc
        if core_api is None:
            raise DiscoveryError(f"cannot look up {self.description}: no Kubernetes API")
        try:
            endpoints = core_api.read_namespaced_endpoints(self.service_name, self.namespace)
        except Exception as exc:
            raise DiscoveryError(f"cannot read the Endpoints of {self.description}: "
                                 f"{_reason(exc)}") from exc
        return self._from_endpoints(endpoints)

    def _pick_port(self, ports: Sequence[Any], where: str) -> int:
        named = {p.name: p.port for p in ports if p is not None and p.port}
        for name in self.port_names:
            if name in named:
                return int(named[name])
        if len(named) == 1:
            return int(next(iter(named.values())))
        raise DiscoveryError(f"{self.description}: {where} has no port named "
                             f"{' or '.join(self.port_names)} (ports: "
                             f"{', '.join(f'{n}={p}' for n, p in named.items()) or 'none'})")

    def _from_slices(self, slices: Sequence[Any]) -> list[tuple[str, str, bool]]:
        found: list[tuple[str, str, bool]] = []
        for item in slices:
            if getattr(item, "address_type", "IPv4") not in ("IPv4", "IPv6"):
                continue  # FQDN slices: not connectable by address
            name = getattr(getattr(item, "metadata", None), "name", "") or "an EndpointSlice"
            if not item.endpoints:
                continue
            port = self._pick_port(item.ports or [], f"EndpointSlice {name}")
            for endpoint in item.endpoints:
                conditions = endpoint.conditions
                ready = conditions is None or conditions.ready is None or bool(conditions.ready)
                for address in endpoint.addresses or []:
                    found.append((format_address(address, port), endpoint.node_name or "",
                                  ready))
        return found

    def _from_endpoints(self, endpoints: Any) -> list[tuple[str, str, bool]]:
        found: list[tuple[str, str, bool]] = []
        for subset in getattr(endpoints, "subsets", None) or []:
            if not subset.addresses and not subset.not_ready_addresses:
                continue
            port = self._pick_port(subset.ports or [], "an Endpoints subset")
            for addresses, ready in ((subset.addresses, True),
                                     (subset.not_ready_addresses, False)):
                for address in addresses or []:
                    found.append((format_address(address.ip, port), address.node_name or "",
                                  ready))
        return found


def _status(exc: Exception) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _reason(exc: Exception) -> str:
    status = _status(exc)
    reason = getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"


def discovery_from_env(env: Mapping[str, str], *, node_name: str,
                       discovery_api: Any = None, core_api: Any = None) -> Discovery | None:
    """Calico's settings: FELIX_TYPHAADDR (explicit address) wins over
    FELIX_TYPHAK8SSERVICENAME (+ FELIX_TYPHAK8SNAMESPACE); None when neither is set."""
    address = env.get("FELIX_TYPHAADDR", "").strip()
    if address:
        return StaticDiscovery([a for a in address.split(",") if a.strip()])
    service = env.get("FELIX_TYPHAK8SSERVICENAME", "").strip()
    if service:
        return KubernetesServiceDiscovery(
            service, env.get("FELIX_TYPHAK8SNAMESPACE", "").strip() or DEFAULT_NAMESPACE,
            node_name=node_name, discovery_api=discovery_api, core_api=core_api)
    return None
