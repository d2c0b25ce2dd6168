"""v1 Service and discovery.k8s.io/v1 EndpointSlice: parsed as kubectl writes them, with
Kubernetes' defaults, and rejected with the resource and field named."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from pyfelix.agent.model import EndpointSlice, Service, ServicePort, SliceEndpoint, ValidationError
from pyfelix.agent.model import parse_resource as parse
from pyfelix.agent.syncer.api import RawUpdate, ResourceKey
from pyfelix.agent.syncer.etcd_keys import etcd_key, parse_etcd_key
from pyfelix.agent.validator import Validator
from pyfelix.cli.main import cli
from tests.model.examples import by_kind


def service(**spec: Any) -> dict[str, Any]:
    body = {"clusterIP": "10.96.0.10", "selector": {"app": "web"},
            "ports": [{"port": 80, "targetPort": 8080}]}
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop"}, "spec": body}


def endpoint_slice(endpoints: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    doc = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "web-abc", "namespace": "shop",
                        "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4", "endpoints": endpoints,
           "ports": [{"name": "", "protocol": "TCP", "port": 8080}]}
    doc.update(extra)
    return doc


def test_service_example_with_defaults_and_affinity() -> None:
    svc = parse(by_kind("Service"))
    assert isinstance(svc, Service)
    assert svc.key == ResourceKey("Service", "prod", "api")
    assert svc.cluster_ips == ("10.96.0.20",)
    assert svc.ports == (ServicePort("http", 6, 80, "http"), ServicePort("dns", 17, 53, 5353))
    assert svc.selector == (("app", "api"),)
    assert svc.client_ip_affinity and svc.affinity_timeout == 600

    plain = parse(service())
    assert isinstance(plain, Service)
    assert (plain.type, plain.session_affinity, plain.affinity_timeout) == ("ClusterIP", "None",
                                                                             10800)
    assert plain.ports == (ServicePort("", 6, 80, 8080),)
    assert not plain.external_traffic_local and not plain.internal_traffic_local
    # targetPort defaults to port; a headless Service has no cluster IP; no selector: None
    doc = service(clusterIP="None", ports=[{"port": 53, "protocol": "UDP"}])
    del doc["spec"]["selector"]
    headless = parse(doc)
    assert isinstance(headless, Service)
    assert headless.cluster_ips == () and headless.selector is None
    assert headless.ports == (ServicePort("", 17, 53, 53),)


def test_endpoint_slice_example_conditions() -> None:
    eps = parse(by_kind("EndpointSlice"))
    assert isinstance(eps, EndpointSlice)
    assert eps.service_name == "api" and eps.address_type == "IPv4"
    assert eps.endpoints[0] == SliceEndpoint(("10.65.0.7",), True, True, False, "node1")
    assert eps.endpoints[1].terminating and not eps.endpoints[1].ready
    assert [(p.name, p.protocol, p.port) for p in eps.ports] == [("http", 6, 8080),
                                                                ("dns", 17, 5353)]
    # ready unset counts as ready (as Kubernetes documents it)
    bare = parse(endpoint_slice([{"addresses": ["10.65.0.3"]}]))
    assert isinstance(bare, EndpointSlice) and bare.endpoints[0].ready


@pytest.mark.parametrize(("doc", "field", "words"), [
    (service(type="Weird"), "spec.type", "not one of"),
    (service(clusterIP="10.96.0.300"), "spec.clusterIP", "invalid IP address"),
    (service(clusterIPs=["10.96.0.11"]), "spec.clusterIPs[0]", "must equal clusterIP"),
    (service(ports=[{"port": 0}]), "spec.ports[0].port", "out of range"),
    (service(ports=[{"port": 80, "protocol": "ICMP"}]), "spec.ports[0].protocol", "not one of"),
    (service(ports=[{"port": 80, "targetPort": "Not_a_name"}]), "spec.ports[0].targetPort",
     "not a port number or name"),
    (service(ports=[{"port": 80, "name": "a"}, {"port": 81}]), "spec.ports[1].name",
     "several ports"),
    (service(ports=[{"port": 80, "name": "a"}, {"port": 80, "name": "b"}]),
     "spec.ports[1].port", "duplicate"),
    (service(sessionAffinity="ClientIP",
             sessionAffinityConfig={"clientIP": {"timeoutSeconds": 86401}}),
     "spec.sessionAffinityConfig.clientIP.timeoutSeconds", "out of range"),
    (service(externalTrafficPolicy="Sometimes"), "spec.externalTrafficPolicy", "not one of"),
    (service(selector={"bad key!": "x"}), "spec.selector.bad key!", "invalid label key"),
    (endpoint_slice([{"addresses": ["10.65.0.3"]}], addressType="IPX"), "addressType",
     "not one of"),
    (endpoint_slice([{"addresses": []}]), "endpoints[0].addresses", "1 to 100"),
    (endpoint_slice([{"addresses": ["fd00::1"]}]), "endpoints[0].addresses[0]",
     "not an IPv4 address"),
    (endpoint_slice([{"addresses": ["10.65.0.3"], "conditions": {"ready": "yes"}}]),
     "endpoints[0].conditions.ready", "true or false"),
    (endpoint_slice([{"addresses": ["10.65.0.3"]}], ports=[{"port": 70000}]),
     "ports[0].port", "out of range"),
])
def test_invalid_fields_are_named(doc: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse(doc)
    message = str(info.value)
    assert f": {field}: " in message and words in message, message
    assert message.startswith(("Service(shop/web)", "EndpointSlice(shop/web-abc)")), message


def test_names_and_owner_label_are_checked() -> None:
    doc = service()
    doc["metadata"]["name"] = "1web"
    with pytest.raises(ValidationError, match=r"metadata\.name: .*DNS-1035"):
        parse(doc)
    orphan = endpoint_slice([{"addresses": ["10.65.0.3"]}])
    orphan["metadata"]["labels"] = {}
    with pytest.raises(ValidationError, match=r"kubernetes\.io/service-name: required"):
        parse(orphan)
    wrong_api = service()
    wrong_api["apiVersion"] = "discovery.k8s.io/v1"
    with pytest.raises(ValidationError, match=r"apiVersion: .*'v1'"):
        parse(wrong_api)


def test_validator_passes_services_through_and_counts_bad_ones() -> None:
    validator = Validator()
    good = validator.on_updates([RawUpdate(ResourceKey("Service", "shop", "web"), service())])
    assert [(u.key, type(u.value)) for u in good] == [(ResourceKey("Service", "shop", "web"),
                                                       Service)]
    bad = validator.on_updates([RawUpdate(ResourceKey("Service", "shop", "web"),
                                          service(type="Weird"))])
    assert [(u.key, u.value) for u in bad] == [(ResourceKey("Service", "shop", "web"), None)]
    assert "spec.type" in validator.errors[ResourceKey("Service", "shop", "web")]


def test_file_datastore_apply_get_and_etcd_layout(tmp_path: Any) -> None:
    source = tmp_path / "svc.yaml"
    source.write_text(yaml.safe_dump_all([service(), endpoint_slice(
        [{"addresses": ["10.65.0.3"], "conditions": {"ready": True}}])]))
    store = tmp_path / "store"
    runner = CliRunner()
    result = runner.invoke(cli, ["apply", "-f", str(source), "--datastore", str(store)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["EndpointSlice(shop/web-abc) created",
                                          "Service(shop/web) created"]
    listed = runner.invoke(cli, ["get", "services", "-n", "shop", "--datastore", str(store)])
    assert listed.stdout.split() == ["NAMESPACE", "NAME", "shop", "web"]
    listed = runner.invoke(cli, ["get", "endpointslices", "-A", "--datastore", str(store)])
    assert listed.stdout.split() == ["NAMESPACE", "NAME", "shop", "web-abc"]
    # invalid input: nothing written, the field named
    source.write_text(yaml.safe_dump(service(clusterIP="nope")))
    result = runner.invoke(cli, ["apply", "-f", str(source), "--datastore", str(store)])
    assert result.exit_code != 0 and "spec.clusterIP" in result.stderr
    # etcd: Kubernetes kinds under the kubernetes directory, round-tripping
    for key, path in ((ResourceKey("Service", "shop", "web"),
                       "/calico/resources/v3/kubernetes/services/shop/web"),
                      (ResourceKey("EndpointSlice", "shop", "web-abc"),
                       "/calico/resources/v3/kubernetes/endpointslices/shop/web-abc")):
        assert etcd_key(key) == path and parse_etcd_key(path) == key
