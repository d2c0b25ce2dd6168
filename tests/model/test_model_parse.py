"""Every kind parses from realistic YAML into the typed model, with Calico's defaults."""

from __future__ import annotations

import dataclasses

import pytest

from pyfelix.agent.model import (
    KNOWN_KINDS,
    BGPConfiguration,
    BGPPeer,
    FelixConfiguration,
    HostEndpoint,
    IPPool,
    K8sNetworkPolicy,
    Namespace,
    NetworkPolicy,
    NetworkSet,
    Node,
    Pod,
    Profile,
    ServiceAccount,
    Tier,
    WorkloadEndpoint,
    parse_resource,
)
from pyfelix.agent.syncer.api import ResourceKey
from tests.model.examples import by_kind, documents, load


def test_every_example_parses_and_every_kind_is_covered() -> None:
    parsed = [parse_resource(doc) for doc in documents()]
    kinds = {r.key.kind for r in parsed}
    assert kinds == KNOWN_KINDS - {"BlockAffinity"}


def test_model_objects_are_frozen_and_hashable() -> None:
    for resource in (parse_resource(doc) for doc in documents()):
        hash(resource)
        with pytest.raises(dataclasses.FrozenInstanceError):
            resource.meta = resource.meta  # type: ignore[misc]


def test_tier() -> None:
    tier = parse_resource(by_kind("Tier"))
    assert tier == Tier(ResourceKey("Tier", "", "security"), tier.meta, order=100.0,
                        default_action="Pass")


def test_default_tier_gets_calicos_fixed_order() -> None:
    tier = parse_resource(load("{apiVersion: projectcalico.org/v3, kind: Tier, "
                               "metadata: {name: default}, spec: {}}"))
    assert isinstance(tier, Tier) and tier.order == 1_000_000.0


def test_global_network_policy_in_a_tier() -> None:
    gnp = parse_resource(by_kind("GlobalNetworkPolicy", "security.allow-dns"))
    assert isinstance(gnp, NetworkPolicy)
    assert gnp.is_global and gnp.tier == "security" and gnp.order == 10.0
    assert gnp.policy_id == "security.allow-dns"
    assert gnp.types == ("Egress",)
    assert gnp.namespace_selector == 'kubernetes.io/metadata.name != "kube-system"'
    assert [r.action for r in gnp.egress] == ["Allow", "Allow", "Pass"]
    assert gnp.meta.labels_dict == {"owner": "platform"}


def test_do_not_track_host_policy() -> None:
    gnp = parse_resource(by_kind("GlobalNetworkPolicy", "host-protect"))
    assert isinstance(gnp, NetworkPolicy)
    assert gnp.do_not_track and gnp.apply_on_forward and not gnp.pre_dnat
    assert gnp.types == ("Ingress",)


def test_namespaced_network_policy() -> None:
    np = parse_resource(by_kind("NetworkPolicy"))
    assert isinstance(np, NetworkPolicy)
    assert not np.is_global and np.tier == "default" and np.order == 200.5
    assert np.key == ResourceKey("NetworkPolicy", "prod", "api-ingress")
    assert np.policy_id == "prod/api-ingress"
    assert np.types == ("Ingress", "Egress")  # both rule kinds present, no explicit types


def test_network_sets_get_the_namespace_label_only_when_namespaced() -> None:
    gns = parse_resource(by_kind("GlobalNetworkSet"))
    assert isinstance(gns, NetworkSet) and gns.is_global
    assert gns.nets == ("169.254.169.254/32", "fd00:ec2::254/128")
    assert gns.meta.labels_dict == {"kind": "metadata-service"}
    ns = parse_resource(by_kind("NetworkSet"))
    assert isinstance(ns, NetworkSet) and not ns.is_global
    assert ns.nets == ("203.0.113.0/24", "192.0.2.5/32")
    assert ns.meta.labels_dict == {"partner": "yes", "projectcalico.org/namespace": "prod"}


def test_workload_endpoint() -> None:
    wep = parse_resource(by_kind("WorkloadEndpoint"))
    assert isinstance(wep, WorkloadEndpoint)
    assert wep.node == "node1" and wep.pod == "legacy-vm" and wep.workload == "legacy-vm"
    assert wep.endpoint_id == "prod/legacy-vm"
    assert wep.ip_networks == ("10.65.0.20/32", "fd00:65::20/128")
    assert wep.profiles == ("kns.prod", "ksa.prod.default")
    assert [(p.name, p.protocol, p.port, p.host_port) for p in wep.ports] == [
        ("http", 6, 8080, 0), ("metrics", 17, 9125, 19125)]
    assert wep.meta.labels_dict == {"app": "legacy", "projectcalico.org/namespace": "prod",
                                    "projectcalico.org/orchestrator": "k8s"}
    assert wep.ip_nats[0].external_ip == "172.16.0.20"


def test_host_endpoint_and_profile() -> None:
    hep = parse_resource(by_kind("HostEndpoint"))
    assert isinstance(hep, HostEndpoint)
    assert hep.interface_name == "eth0" and hep.expected_ips == ("198.18.0.1",)
    assert hep.ports[0].name == "bgp" and hep.ports[0].port == 179
    profile = parse_resource(by_kind("Profile"))
    assert isinstance(profile, Profile)
    assert profile.labels_to_apply == (("zone", "dc1"),)
    assert len(profile.ingress) == 1 and len(profile.egress) == 1


def test_ip_pools_default_block_size_by_family() -> None:
    v4 = parse_resource(by_kind("IPPool", "pods-v4"))
    v6 = parse_resource(by_kind("IPPool", "pods-v6"))
    assert isinstance(v4, IPPool) and isinstance(v6, IPPool)
    assert (v4.block_size, v4.vxlan_mode, v4.nat_outgoing) == (24, "CrossSubnet", True)
    assert (v6.block_size, v6.ipip_mode, v6.node_selector) == (122, "Never", "all()")


def test_calico_node_and_kubernetes_node() -> None:
    calico = parse_resource(by_kind("Node", "node1"))
    assert isinstance(calico, Node) and calico.bgp is not None
    assert calico.bgp.ipv4_address == "198.18.0.1/15" and calico.bgp.as_number == 64512
    assert calico.addresses == ("198.18.0.1",)
    k8s = parse_resource(by_kind("Node", "node2"))
    assert isinstance(k8s, Node) and k8s.bgp is not None
    assert k8s.addresses == ("198.18.0.2",)  # the Hostname entry is not an address
    assert k8s.pod_cidrs == ("10.65.2.0/24",)
    assert (k8s.bgp.ipv4_address, k8s.bgp.as_number) == ("198.18.0.2/15", 64512)


def test_bgp_configuration_and_peers() -> None:
    config = parse_resource(by_kind("BGPConfiguration"))
    assert isinstance(config, BGPConfiguration)
    assert config.service_cluster_ips == ("10.96.0.0/12",)
    assert config.prefix_advertisements[0].communities == ("bgp-large-community", "64512:120")
    peer = parse_resource(by_kind("BGPPeer", "rack1-tor"))
    assert isinstance(peer, BGPPeer)
    assert (peer.peer_ip, peer.port) == ("198.18.255.1", 1179)
    assert peer.as_number == 64513 * 65536 + 1  # dotted notation
    rr = parse_resource(by_kind("BGPPeer", "mesh-rr"))
    assert isinstance(rr, BGPPeer) and rr.peer_selector == "route-reflector == 'true'"


def test_ipv6_bgp_peer_with_port() -> None:
    peer = parse_resource(load("""
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata: {name: v6}
spec: {peerIP: "[fd00::1]:179", asNumber: 65001}
"""))
    assert isinstance(peer, BGPPeer) and (peer.peer_ip, peer.port) == ("fd00::1", 179)


def test_felix_configuration_settings_are_strings() -> None:
    felix = parse_resource(by_kind("FelixConfiguration"))
    assert isinstance(felix, FelixConfiguration)
    settings = dict(felix.settings)
    assert settings["bpfEnabled"] == "true" and settings["healthPort"] == "9099"
    assert settings["failsafeInboundHostPorts"] == '[{"port": 22, "protocol": "tcp"}]'


def test_kubernetes_namespace_service_account_and_pod() -> None:
    ns = parse_resource(by_kind("Namespace"))
    assert isinstance(ns, Namespace) and ns.meta.labels_dict["env"] == "prod"
    assert ns.meta.resource_version == "4711"
    sa = parse_resource(by_kind("ServiceAccount"))
    assert isinstance(sa, ServiceAccount) and sa.key == ResourceKey("ServiceAccount", "prod",
                                                                     "api")
    pod = parse_resource(by_kind("Pod"))
    assert isinstance(pod, Pod)
    assert pod.node_name == "node1" and pod.service_account_name == "api"
    assert pod.pod_ips == ("10.65.0.10", "fd00:65::10")
    # unnamed ports without hostPort are not named ports; init containers count
    assert [(p.name, p.port, p.protocol) for p in pod.ports] == [
        ("http", 8080, 6), ("dns-udp", 5353, 17), ("init-sctp", 7777, 132)]


def test_pod_ip_falls_back_to_pod_ip_then_calico_annotation() -> None:
    doc = by_kind("Pod")
    del doc["status"]["podIPs"]
    doc["status"]["podIP"] = "10.65.0.99"
    pod = parse_resource(doc)
    assert isinstance(pod, Pod) and pod.pod_ips == ("10.65.0.99",)
    doc = by_kind("Pod")
    doc["status"] = {"phase": "Running"}
    doc["metadata"]["annotations"]["cni.projectcalico.org/podIPs"] = "10.65.0.7/32,fd00::7/128"
    pod = parse_resource(doc)
    assert isinstance(pod, Pod) and pod.pod_ips == ("10.65.0.7", "fd00::7")


def test_pod_with_empty_ip_fields_has_no_ip_yet() -> None:
    pod = parse_resource(load("""
apiVersion: v1
kind: Pod
metadata: {name: pending, namespace: prod}
spec: {nodeName: node1}
status: {phase: Pending, podIP: "", podIPs: [{ip: ""}]}
"""))
    assert isinstance(pod, Pod) and pod.pod_ips == () and pod.phase == "Pending"


def test_pod_defaults_service_account_and_reads_deletion() -> None:
    doc = by_kind("Pod")
    del doc["spec"]["serviceAccountName"]
    doc["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    pod = parse_resource(doc)
    assert isinstance(pod, Pod) and pod.service_account_name == "default" and pod.deleted


def test_kubernetes_network_policy() -> None:
    knp = parse_resource(by_kind("KubernetesNetworkPolicy"))
    assert isinstance(knp, K8sNetworkPolicy)
    assert knp.key == ResourceKey("KubernetesNetworkPolicy", "db", "db-from-web")
    assert knp.pod_selector.match_labels == (("app", "postgres"),)
    first, second = knp.ingress[0].peers
    assert first.namespace_selector is not None and first.pod_selector is not None
    assert second.ip_block is not None and second.ip_block.except_ == ("172.17.1.0/24",)
    assert [(p.protocol, p.port, p.end_port) for p in knp.ingress[0].ports] == [
        (6, "pg", None), (6, 6000, 6010)]
    assert knp.egress[0].peers[0].namespace_selector is not None
    assert knp.egress[0].peers[0].namespace_selector.is_empty


@pytest.mark.parametrize(("egress", "expected"), [
    (None, ("Ingress",)),
    ([], ("Ingress",)),
    ([{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}], ("Ingress", "Egress")),
])
def test_kubernetes_policy_types_default_like_the_api_server(egress: object,
                                                             expected: tuple[str, ...]) -> None:
    doc = load("{apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, "
               "metadata: {name: p, namespace: x}, spec: {podSelector: {}}}")
    if egress is not None:
        doc["spec"]["egress"] = egress
    knp = parse_resource(doc)
    assert isinstance(knp, K8sNetworkPolicy) and knp.policy_types == expected


def test_namespaced_kinds_default_to_the_default_namespace() -> None:
    doc = by_kind("NetworkPolicy")
    del doc["metadata"]["namespace"]
    assert parse_resource(doc).key == ResourceKey("NetworkPolicy", "default", "api-ingress")


def test_json_style_documents_parse_too() -> None:
    doc = {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkSet",
           "metadata": {"name": "x", "resourceVersion": 7}, "spec": {"nets": ["10.0.0.1"]}}
    gns = parse_resource(doc)
    assert isinstance(gns, NetworkSet) and gns.meta.resource_version == "7"
