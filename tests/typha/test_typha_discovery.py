"""Typha discovery: explicit lists, and a Kubernetes service's endpoints (EndpointSlices, or
core/v1 Endpoints when the cluster lacks them) through fake API objects that return real
`kubernetes.client` models."""

from __future__ import annotations

import random

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from pyfelix.agent.typha.discovery import (
    DiscoveryError,
    KubernetesServiceDiscovery,
    StaticDiscovery,
    discovery_from_env,
    format_address,
    split_address,
)


def _slice(name: str, endpoints: list[tuple[str, str, bool | None]], *,
           port_name: str = "calico-typha", port: int = 5473,
           address_type: str = "IPv4") -> k8s.V1EndpointSlice:
    return k8s.V1EndpointSlice(
        address_type=address_type, metadata=k8s.V1ObjectMeta(name=name),
        ports=[k8s.DiscoveryV1EndpointPort(name="metrics", port=9093),
               k8s.DiscoveryV1EndpointPort(name=port_name, port=port)],
        endpoints=[k8s.V1Endpoint(addresses=[ip], node_name=node,
                                  conditions=k8s.V1EndpointConditions(ready=ready))
                   for ip, node, ready in endpoints])


class FakeDiscoveryAPI:
    """Serves EndpointSlices by service-name label; `error` makes every call fail."""

    def __init__(self, slices: dict[tuple[str, str], list[k8s.V1EndpointSlice]],
                 error: Exception | None = None) -> None:
        self.slices = slices
        self.error = error
        self.calls: list[tuple[str, str]] = []

    def list_namespaced_endpoint_slice(self, namespace: str, *, label_selector: str
                                       ) -> k8s.V1EndpointSliceList:
        self.calls.append((namespace, label_selector))
        if self.error is not None:
            raise self.error
        label, _, service = label_selector.partition("=")
        assert label == "kubernetes.io/service-name"
        return k8s.V1EndpointSliceList(items=self.slices.get((namespace, service), []))


class FakeCoreAPI:
    def __init__(self, endpoints: dict[tuple[str, str], k8s.V1Endpoints]) -> None:
        self.endpoints = endpoints

    def read_namespaced_endpoints(self, name: str, namespace: str) -> k8s.V1Endpoints:
        try:
            return self.endpoints[(namespace, name)]
        except KeyError:
            raise ApiException(status=404, reason="Not Found") from None


NODES = [("10.0.0.1", "node-a", True), ("10.0.0.2", "node-b", True),
         ("10.0.0.3", "node-c", True), ("10.0.0.4", "node-d", None),
         ("10.0.0.5", "node-e", False), ("10.0.0.6", "node-f", True)]


def _discovery(api: object, node: str = "node-c", **kwargs: object
               ) -> KubernetesServiceDiscovery:
    return KubernetesServiceDiscovery("calico-typha", "kube-system", node_name=node,
                                      discovery_api=api, rng=random.Random(7), **kwargs)


def test_local_endpoint_first_then_the_ready_rest_shuffled() -> None:
    api = FakeDiscoveryAPI({("kube-system", "calico-typha"): [
        _slice("s1", NODES[:3]), _slice("s2", NODES[3:])]})
    discovery = _discovery(api)
    orders = set()
    for _ in range(30):
        addresses = discovery.discover()
        assert addresses[0] == "10.0.0.3:5473"
        assert sorted(addresses[1:]) == ["10.0.0.1:5473", "10.0.0.2:5473", "10.0.0.4:5473",
                                         "10.0.0.6:5473"]  # .5 is not ready; .4 unknown=ready
        orders.add(tuple(addresses[1:]))
    assert len(orders) > 1  # really shuffled
    assert api.calls[0] == ("kube-system", "kubernetes.io/service-name=calico-typha")


def test_no_local_endpoint_means_all_shuffled() -> None:
    api = FakeDiscoveryAPI({("kube-system", "calico-typha"): [_slice("s1", NODES)]})
    discovery = _discovery(api, node="elsewhere")
    firsts = {discovery.discover()[0] for _ in range(40)}
    assert len(firsts) > 1


def test_port_by_name_ipv6_and_fqdn_slices() -> None:
    api = FakeDiscoveryAPI({("kube-system", "calico-typha"): [
        _slice("v6", [("fd00::7", "node-c", True)], port_name="typha", port=6000,
               address_type="IPv6"),
        _slice("fqdn", [("typha.example", "node-c", True)], address_type="FQDN")]})
    assert _discovery(api).discover() == ["[fd00::7]:6000"]
    named = _discovery(FakeDiscoveryAPI({("kube-system", "calico-typha"): [
        _slice("s", [("10.0.0.9", "n", True)], port_name="custom", port=7000)]}),
        port_name="custom")
    assert named.discover() == ["10.0.0.9:7000"]


def test_falls_back_to_endpoints_when_the_slice_api_is_missing() -> None:
    slice_api = FakeDiscoveryAPI({}, error=ApiException(status=404, reason="Not Found"))
    core = FakeCoreAPI({("kube-system", "calico-typha"): k8s.V1Endpoints(subsets=[
        k8s.V1EndpointSubset(
            addresses=[k8s.V1EndpointAddress(ip="10.1.0.1", node_name="node-x"),
                       k8s.V1EndpointAddress(ip="10.1.0.2", node_name="node-c")],
            not_ready_addresses=[k8s.V1EndpointAddress(ip="10.1.0.3", node_name="node-y")],
            ports=[k8s.CoreV1EndpointPort(name="calico-typha", port=5473)])])})
    discovery = _discovery(slice_api, core_api=core)
    assert discovery.discover() == ["10.1.0.2:5473", "10.1.0.1:5473"]


@pytest.mark.parametrize(("api", "core", "message"), [
    (FakeDiscoveryAPI({}), None, "service kube-system/calico-typha has no ready endpoint"),
    (FakeDiscoveryAPI({("kube-system", "calico-typha"): [
        _slice("s", [("10.0.0.1", "n", False)])]}), None,
     "service kube-system/calico-typha has no ready endpoint (1 not ready)"),
    (FakeDiscoveryAPI({}, error=ApiException(status=403, reason="Forbidden")), None,
     "cannot list the EndpointSlices of service kube-system/calico-typha: HTTP 403 Forbidden"),
    (FakeDiscoveryAPI({}, error=ApiException(status=404, reason="Not Found")), FakeCoreAPI({}),
     "cannot read the Endpoints of service kube-system/calico-typha: HTTP 404 Not Found"),
    (FakeDiscoveryAPI({("kube-system", "calico-typha"): [k8s.V1EndpointSlice(
        address_type="IPv4", metadata=k8s.V1ObjectMeta(name="odd"),
        ports=[k8s.DiscoveryV1EndpointPort(name="a", port=1),
               k8s.DiscoveryV1EndpointPort(name="b", port=2)],
        endpoints=[k8s.V1Endpoint(addresses=["10.0.0.1"])])]}), None,
     "EndpointSlice odd has no port named calico-typha or typha (ports: a=1, b=2)"),
])
def test_discovery_errors_name_the_service(api: FakeDiscoveryAPI, core: FakeCoreAPI | None,
                                           message: str) -> None:
    with pytest.raises(DiscoveryError) as caught:
        _discovery(api, core_api=core).discover()
    assert message in str(caught.value)


def test_environment_precedence() -> None:
    explicit = discovery_from_env({"FELIX_TYPHAADDR": "10.0.0.1:5473",
                                   "FELIX_TYPHAK8SSERVICENAME": "calico-typha"}, node_name="n")
    assert isinstance(explicit, StaticDiscovery)
    assert explicit.discover() == ["10.0.0.1:5473"]
    service = discovery_from_env({"FELIX_TYPHAK8SSERVICENAME": "typha-svc"}, node_name="n")
    assert isinstance(service, KubernetesServiceDiscovery)
    assert service.description == "service kube-system/typha-svc"
    custom = discovery_from_env({"FELIX_TYPHAK8SSERVICENAME": "t",
                                 "FELIX_TYPHAK8SNAMESPACE": "calico-system"}, node_name="n")
    assert custom is not None and custom.description == "service calico-system/t"
    assert discovery_from_env({}, node_name="n") is None


def test_addresses() -> None:
    assert split_address("[fd00::1]:5473") == ("fd00::1", 5473)
    assert split_address("typha.kube-system.svc:5473") == ("typha.kube-system.svc", 5473)
    assert format_address("fd00::1", 5473) == "[fd00::1]:5473"
    for bad in ("nohost", ":5473", "host:0", "host:99999", "host:x"):
        with pytest.raises(ValueError, match="is not HOST:PORT"):
            split_address(bad)
    assert StaticDiscovery(["b:1", "a:2", "b:1"]).discover() == ["b:1", "a:2"]
