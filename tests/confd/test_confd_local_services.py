"""Routes of externalTrafficPolicy Local services (`FamilyConfig.service_routes`): which
services, which IPs, which endpoints count."""

from __future__ import annotations

from typing import Any

import pytest
from confd_fakes import doc_bgp_config, doc_node, upd

from pyfelix.confd.bgp_config import compute_bird_config
from pyfelix.confd.bgp_view import state_from_updates


def service(name: str = "web", namespace: str = "shop", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"clusterIP": "10.96.5.10", "externalTrafficPolicy": "Local",
                            "type": "NodePort", "ports": [{"port": 80}]}
    base.update(spec)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace}, "spec": base}


def endpoint_slice(service_name: str = "web", namespace: str = "shop", *,
                   node: str = "node1", ready: bool | None = True) -> dict[str, Any]:
    endpoint: dict[str, Any] = {"addresses": ["10.65.1.5"], "nodeName": node}
    if ready is not None:
        endpoint["conditions"] = {"ready": ready}
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service_name}-x", "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service_name}},
            "addressType": "IPv4", "endpoints": [endpoint],
            "ports": [{"port": 80, "protocol": "TCP"}]}


def routes(*docs: dict[str, Any], config: dict[str, Any] | None = None) -> list[str]:
    cfg = config if config is not None else {"serviceClusterIPs": [{"cidr": "10.96.0.0/12"}]}
    state, problems = state_from_updates([upd(d) for d in (
        doc_bgp_config(**cfg), doc_node("node1", "198.18.0.1/15"), *docs)])
    assert problems == {}
    config_ = compute_bird_config(state, "node1")
    return [r.cidr for r in config_.ipv4.service_routes]


def test_ready_local_endpoint_gives_the_cluster_ip() -> None:
    assert routes(service(), endpoint_slice()) == ["10.96.5.10/32"]
    assert routes(service(), endpoint_slice(ready=None)) == ["10.96.5.10/32"]  # unset: ready


@pytest.mark.parametrize("docs", [
    pytest.param((service(), endpoint_slice(node="node2")), id="endpoint-on-another-node"),
    pytest.param((service(), endpoint_slice(ready=False)), id="not-ready"),
    pytest.param((service(),), id="no-slice"),
    pytest.param((service(externalTrafficPolicy="Cluster"), endpoint_slice()), id="cluster"),
    pytest.param((service(), endpoint_slice(namespace="other")), id="slice-other-namespace"),
    pytest.param((service(clusterIP="None", type="ClusterIP", externalTrafficPolicy=None),
                  endpoint_slice()), id="headless"),
])
def test_no_route(docs: tuple[dict[str, Any], ...]) -> None:
    assert routes(*docs) == []


def test_external_and_load_balancer_ips_only_inside_their_ranges() -> None:
    svc = service(type="LoadBalancer", externalIPs=["203.0.113.7", "192.0.2.7"])
    svc["status"] = {"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}, {"ip": "192.0.2.9"}]}}
    config = {"serviceExternalIPs": [{"cidr": "203.0.113.0/24"}],
              "serviceLoadBalancerIPs": [{"cidr": "198.51.100.0/24"}]}
    # no serviceClusterIPs: the cluster IP is not advertised
    assert routes(svc, endpoint_slice(), config=config) == ["198.51.100.9/32",
                                                           "203.0.113.7/32"]
    assert routes(svc, endpoint_slice(), config={}) == []
