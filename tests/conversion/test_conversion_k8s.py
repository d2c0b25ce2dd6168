"""Kubernetes -> Calico conversion, checked by structure and by what the selectors match.

The semantic tests convert Namespaces and Pods into profiles and workload endpoints, give
each endpoint its labels plus its profiles' labelsToApply (as the calc graph does) and
evaluate the converted policy's selectors against them.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pyfelix.agent import selector
from pyfelix.agent.conversion import (
    k8s_policy_to_calico,
    label_selector_to_calico,
    namespace_to_profile,
    pod_endpoint_problem,
    pod_to_workload_endpoint,
    service_account_to_profile,
    to_calico,
    workload_endpoint_name,
    workload_interface_name,
)
from pyfelix.agent.model import (
    EndpointPort,
    EntityRule,
    K8sNetworkPolicy,
    Namespace,
    NetworkPolicy,
    Pod,
    Port,
    Profile,
    Rule,
    ServiceAccount,
    WorkloadEndpoint,
    entity_selector,
    inherited_labels,
    parse_resource,
    policy_selector,
)
from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.lab import naming as lab_naming
from tests.model.examples import by_kind

# --- names ------------------------------------------------------------------------------------


def test_interface_name_is_calicos_sha1_scheme() -> None:
    # Golden values from `printf '<ns>.<pod>' | sha1sum | cut -c1-11`.
    assert workload_interface_name("default", "nginx") == "calic440f455693"
    assert workload_interface_name("prod", "api-7d9f8-abcde") == "cali1fc0ca3ecf5"
    assert workload_interface_name("default", "nginx", prefix="tap") == "tapc440f455693"
    assert len(workload_interface_name("a" * 63, "b" * 253)) == 15


def test_interface_prefix_that_cannot_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="too long"):
        workload_interface_name("default", "nginx", prefix="toolong")


@pytest.mark.parametrize(("namespace", "pod"), [("default", "nginx"), ("kube-system", "dns-1"),
                                                ("x", "a.b-c"), ("prod", "api-7d9f8-abcde")])
def test_lab_harness_computes_the_same_interface_names(namespace: str, pod: str) -> None:
    for prefix in ("cali", "tap", "pf"):
        assert workload_interface_name(namespace, pod, prefix) == \
            lab_naming.workload_interface_name(namespace, pod, prefix)


def test_workload_endpoint_names_escape_dashes() -> None:
    assert workload_endpoint_name("node1", "nginx") == "node1-k8s-nginx-eth0"
    assert workload_endpoint_name("node-a", "web-1") == "node--a-k8s-web--1-eth0"


# --- pods -------------------------------------------------------------------------------------


def pod_doc(**changes: Any) -> dict[str, Any]:
    doc = by_kind("Pod")
    for path, value in changes.items():
        section, _, field = path.partition("__")
        target = doc.setdefault(section, {})
        if value is None:
            target.pop(field, None)
        else:
            target[field] = value
    return doc


def pod(**changes: Any) -> Pod:
    parsed = parse_resource(pod_doc(**changes))
    assert isinstance(parsed, Pod)
    return parsed


def test_pod_becomes_a_workload_endpoint() -> None:
    wep = pod_to_workload_endpoint(pod())
    assert isinstance(wep, WorkloadEndpoint)
    assert wep.key == ResourceKey("WorkloadEndpoint", "prod", "node1-k8s-api--7d9f8--abcde-eth0")
    assert (wep.node, wep.orchestrator, wep.workload, wep.pod, wep.endpoint) == (
        "node1", "k8s", "api-7d9f8-abcde", "api-7d9f8-abcde", "eth0")
    assert wep.endpoint_id == "prod/api-7d9f8-abcde"
    assert wep.interface_name == "cali1fc0ca3ecf5"
    assert wep.ip_networks == ("10.65.0.10/32", "fd00:65::10/128")
    assert wep.profiles == ("kns.prod", "ksa.prod.api")
    assert wep.ports == (EndpointPort("http", 6, 8080), EndpointPort("dns-udp", 17, 5353),
                         EndpointPort("init-sctp", 132, 7777))
    assert wep.meta.labels_dict == {
        "app": "api", "role": "api", "pod-template-hash": "7d9f8",
        "projectcalico.org/namespace": "prod", "projectcalico.org/orchestrator": "k8s",
        "projectcalico.org/serviceaccount": "api"}
    assert wep.service_account_name == "api" and wep.container_id == "abc"


def test_pod_labels_cannot_impersonate_namespace_or_service_account_labels() -> None:
    doc = pod_doc()
    doc["metadata"]["labels"].update({"pcns.team": "admin", "pcsa.projectcalico.org/name": "x",
                                      "projectcalico.org/namespace": "kube-system"})
    parsed = parse_resource(doc)
    assert isinstance(parsed, Pod)
    wep = pod_to_workload_endpoint(parsed)
    assert wep is not None
    labels = wep.meta.labels_dict
    assert "pcns.team" not in labels and "pcsa.projectcalico.org/name" not in labels
    assert labels["projectcalico.org/namespace"] == "prod"


def test_host_port_without_name_is_kept_as_calico_does() -> None:
    doc = pod_doc()
    doc["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    del doc["spec"]["initContainers"]
    parsed = parse_resource(doc)
    assert isinstance(parsed, Pod)
    wep = pod_to_workload_endpoint(parsed)
    assert wep is not None and wep.ports == (EndpointPort("", 6, 80, 8080),)


def test_interface_prefix_is_configurable() -> None:
    wep = pod_to_workload_endpoint(pod(), interface_prefix="tap")
    assert wep is not None and wep.interface_name == "tap1fc0ca3ecf5"


@pytest.mark.parametrize(("changes", "reason"), [
    ({"spec__hostNetwork": True}, "host network"),
    ({"spec__nodeName": None}, "not scheduled"),
    ({"status__podIPs": None, "status__podIP": None}, "no IP"),
    ({"status__phase": "Succeeded"}, "finished"),
    ({"status__phase": "Failed"}, "finished"),
    ({"metadata__deletionTimestamp": "2024-05-01T10:00:00Z"}, "being deleted"),
])
def test_pods_without_endpoint(changes: dict[str, Any], reason: str) -> None:
    converted = pod(**changes)
    problem = pod_endpoint_problem(converted)
    assert problem is not None and reason in problem
    assert pod_to_workload_endpoint(converted) is None
    assert to_calico(converted) == {}


def test_long_service_account_names_get_no_label_but_keep_the_profile() -> None:
    name = "sa-" + "x" * 70
    wep = pod_to_workload_endpoint(pod(spec__serviceAccountName=name))
    assert wep is not None
    assert "projectcalico.org/serviceaccount" not in wep.meta.labels_dict
    assert wep.profiles == ("kns.prod", f"ksa.prod.{name}")


# --- namespaces and service accounts -----------------------------------------------------------


def test_namespace_becomes_an_allow_all_profile_with_pcns_labels() -> None:
    ns = parse_resource(by_kind("Namespace"))
    assert isinstance(ns, Namespace)
    profile = namespace_to_profile(ns)
    assert profile.key == ResourceKey("Profile", "", "kns.prod")
    assert profile.ingress == (Rule("Allow"),) and profile.egress == (Rule("Allow"),)
    assert dict(profile.labels_to_apply) == {
        "pcns.env": "prod", "pcns.kubernetes.io/metadata.name": "prod",
        "pcns.projectcalico.org/name": "prod"}


def test_service_account_becomes_a_rule_less_profile_with_pcsa_labels() -> None:
    sa = parse_resource(by_kind("ServiceAccount"))
    assert isinstance(sa, ServiceAccount)
    profile = service_account_to_profile(sa)
    assert profile.key == ResourceKey("Profile", "", "ksa.prod.api")
    assert profile.ingress == () and profile.egress == ()
    assert dict(profile.labels_to_apply) == {"pcsa.team": "backend",
                                             "pcsa.projectcalico.org/name": "api"}


def test_calico_resources_pass_through_unchanged() -> None:
    gnp = parse_resource(by_kind("GlobalNetworkPolicy", "host-protect"))
    assert to_calico(gnp) == {gnp.key: gnp}


# --- network policy: structure --------------------------------------------------------------------


def knp(spec_yaml: str, namespace: str = "db", name: str = "p") -> NetworkPolicy:
    doc = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": namespace},
           "spec": yaml.safe_load(spec_yaml)}
    parsed = parse_resource(doc)
    assert isinstance(parsed, K8sNetworkPolicy)
    converted = k8s_policy_to_calico(parsed)
    assert to_calico(parsed) == {converted.key: converted}
    return converted


def test_policy_name_key_order_and_selector() -> None:
    policy = knp("{podSelector: {matchLabels: {app: postgres}}}", name="db-from-web")
    assert policy.key == ResourceKey("NetworkPolicy", "db", "knp.default.db-from-web")
    assert policy.policy_id == "db/knp.default.db-from-web"
    assert not policy.is_global and policy.tier == "default" and policy.order == 1000.0
    assert policy.selector == "projectcalico.org/orchestrator == 'k8s' && app == 'postgres'"


def test_policy_types_ingress_without_rules_is_deny_all_ingress() -> None:
    policy = knp("{podSelector: {}, policyTypes: [Ingress]}")
    assert policy.types == ("Ingress",) and policy.ingress == () and policy.egress == ()
    assert policy.selector == "projectcalico.org/orchestrator == 'k8s'"


@pytest.mark.parametrize(("spec", "types"), [
    ("{podSelector: {}}", ("Ingress",)),
    ("{podSelector: {}, egress: [{}]}", ("Ingress", "Egress")),
    ("{podSelector: {}, policyTypes: [Egress]}", ("Egress",)),
    ("{podSelector: {}, policyTypes: [Egress, Ingress]}", ("Ingress", "Egress")),
])
def test_policy_types(spec: str, types: tuple[str, ...]) -> None:
    assert knp(spec).types == types


def test_empty_rule_allows_everything() -> None:
    policy = knp("{podSelector: {}, ingress: [{}], egress: [{}]}")
    assert policy.ingress == (Rule("Allow"),) and policy.egress == (Rule("Allow"),)


def test_peers_in_one_entry_are_anded_separate_entries_are_ored() -> None:
    policy = knp("""
podSelector: {}
ingress:
  - from:
      - {namespaceSelector: {matchLabels: {team: web}}, podSelector: {matchLabels: {app: fe}}}
      - podSelector: {matchLabels: {app: admin}}
""")
    first, second = policy.ingress
    assert first.source == EntityRule(
        selector="projectcalico.org/orchestrator == 'k8s' && app == 'fe'",
        namespace_selector="team == 'web'")
    assert second.source == EntityRule(
        selector="projectcalico.org/orchestrator == 'k8s' && app == 'admin'")


def test_empty_namespace_selector_is_all_namespaces() -> None:
    policy = knp("{podSelector: {}, ingress: [{from: [{namespaceSelector: {}}]}]}")
    (rule,) = policy.ingress
    assert rule.source.namespace_selector == "all()"
    assert rule.source.selector == "projectcalico.org/orchestrator == 'k8s'"


def test_match_expressions_spelled_as_calico_spells_them() -> None:
    policy = knp("""
podSelector:
  matchLabels: {app: db}
  matchExpressions:
    - {key: tier, operator: In, values: [a, b]}
    - {key: env, operator: NotIn, values: [dev]}
    - {key: example.com/owner, operator: Exists}
    - {key: legacy, operator: DoesNotExist}
""")
    assert policy.selector == (
        "projectcalico.org/orchestrator == 'k8s' && app == 'db' && tier in { 'a', 'b' } && "
        "env not in { 'dev' } && has(example.com/owner) && ! has(legacy)")
    selector.parse(policy.selector)


def test_label_selector_for_namespaces_without_orchestrator_term() -> None:
    assert label_selector_to_calico(None, pods=False) == ""
    assert label_selector_to_calico(None, pods=True) == "projectcalico.org/orchestrator == 'k8s'"


def test_ip_block_with_except() -> None:
    policy = knp("""
podSelector: {}
egress:
  - to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16, 10.2.0.0/16]}}]
""")
    (rule,) = policy.egress
    assert rule.destination == EntityRule(nets=("10.0.0.0/8",),
                                          not_nets=("10.1.0.0/16", "10.2.0.0/16"))
    assert rule.protocol is None


def test_ports_named_numbered_ranges_and_protocol_split() -> None:
    policy = knp("""
podSelector: {}
ingress:
  - from: [{podSelector: {}}, {ipBlock: {cidr: 192.0.2.0/24}}]
    ports:
      - {port: http}
      - {protocol: TCP, port: 8443}
      - {protocol: TCP, port: 8000, endPort: 8100}
      - {protocol: TCP, port: 8101}
      - {protocol: UDP, port: 53}
      - {protocol: SCTP}
""")
    # one rule per (protocol, peer), protocols sorted by name: SCTP, TCP, UDP
    assert [(r.protocol, r.source.nets) for r in policy.ingress] == [
        (132, ()), (132, ("192.0.2.0/24",)), (6, ()), (6, ("192.0.2.0/24",)),
        (17, ()), (17, ("192.0.2.0/24",))]
    sctp, _, tcp, _, udp, _ = policy.ingress
    assert sctp.destination.ports == ()  # a port entry without port: every SCTP port
    # named ports first, then numeric ports merged into ranges
    assert tcp.destination.ports == (Port(name="http"), Port(8000, 8101), Port(8443, 8443))
    assert udp.destination.ports == (Port(53, 53),)


def test_port_entry_without_port_wins_over_specific_ports_of_its_protocol() -> None:
    policy = knp("""
podSelector: {}
ingress: [{ports: [{protocol: TCP, port: 80}, {protocol: TCP}, {protocol: TCP, port: 81}]}]
""")
    (rule,) = policy.ingress
    assert rule.protocol == 6 and rule.destination.ports == ()


def test_egress_rules_put_peer_and_ports_in_the_destination() -> None:
    policy = knp("""
podSelector: {matchLabels: {app: web}}
policyTypes: [Egress]
egress:
  - to: [{namespaceSelector: {matchLabels: {team: db}}}]
    ports: [{protocol: TCP, port: pg}]
""")
    (rule,) = policy.egress
    assert rule.source == EntityRule()
    assert rule.destination == EntityRule(
        selector="projectcalico.org/orchestrator == 'k8s'", namespace_selector="team == 'db'",
        ports=(Port(name="pg"),))
    assert rule.protocol == 6 and policy.types == ("Egress",)


# --- network policy: semantics -------------------------------------------------------------

CLUSTER = """
apiVersion: v1
kind: Namespace
metadata: {name: web, labels: {team: web}}
---
apiVersion: v1
kind: Namespace
metadata: {name: db, labels: {team: db}}
---
apiVersion: v1
kind: Namespace
metadata: {name: other, labels: {team: other}}
---
apiVersion: v1
kind: Pod
metadata: {name: frontend, namespace: web, labels: {app: fe}}
spec: {nodeName: n1}
status: {podIP: 10.65.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: intruder, namespace: other, labels: {app: fe}}
spec: {nodeName: n1}
status: {podIP: 10.65.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: postgres, namespace: db, labels: {app: postgres}}
spec: {nodeName: n1}
status: {podIP: 10.65.0.3}
---
apiVersion: v1
kind: Pod
metadata: {name: backup, namespace: db, labels: {app: backup}}
spec: {nodeName: n1}
status: {podIP: 10.65.0.4}
"""


def cluster_labels() -> dict[str, dict[str, str]]:
    """`<ns>/<pod>` -> the pod endpoint's labels including inherited profile labels."""
    profiles: dict[str, Profile] = {}
    endpoints: list[WorkloadEndpoint] = []
    for doc in yaml.safe_load_all(CLUSTER):
        for converted in to_calico(parse_resource(doc)).values():
            if isinstance(converted, Profile):
                profiles[converted.key.name] = converted
            elif isinstance(converted, WorkloadEndpoint):
                endpoints.append(converted)
    return {wep.endpoint_id: inherited_labels(
        wep.meta.labels_dict,
        [dict(profiles[p].labels_to_apply) for p in wep.profiles if p in profiles])
        for wep in endpoints}


def peers_matched(rule_entity: EntityRule, namespace: str) -> set[str]:
    text = entity_selector(rule_entity, namespace)
    parsed = selector.parse(text)
    negative = selector.parse(rule_entity.not_selector) if rule_entity.not_selector else None
    return {name for name, labels in cluster_labels().items()
            if parsed.evaluate(labels) and not (negative and negative.evaluate(labels))}


def sources(policy: NetworkPolicy) -> set[str]:
    matched: set[str] = set()
    for rule in policy.ingress:
        matched |= peers_matched(rule.source, policy.key.namespace)
    return matched


def applies_to(policy: NetworkPolicy) -> set[str]:
    parsed = selector.parse(policy_selector(policy))
    return {name for name, labels in cluster_labels().items() if parsed.evaluate(labels)}


def test_semantics_namespace_selector_picks_pods_of_matching_namespaces() -> None:
    policy = knp("""
podSelector: {matchLabels: {app: postgres}}
ingress: [{from: [{namespaceSelector: {matchLabels: {team: web}}}]}]
""")
    assert applies_to(policy) == {"db/postgres"}
    assert sources(policy) == {"web/frontend"}


def test_semantics_pod_selector_alone_means_same_namespace() -> None:
    policy = knp("{podSelector: {}, ingress: [{from: [{podSelector: {}}]}]}")
    assert applies_to(policy) == {"db/postgres", "db/backup"}
    assert sources(policy) == {"db/postgres", "db/backup"}


def test_semantics_and_within_a_peer() -> None:
    policy = knp("""
podSelector: {}
ingress:
  - from: [{namespaceSelector: {matchLabels: {team: web}}, podSelector: {matchLabels: {app: fe}}}]
""")
    assert sources(policy) == {"web/frontend"}  # not other/intruder, also app=fe


def test_semantics_or_across_peers() -> None:
    policy = knp("""
podSelector: {}
ingress:
  - from:
      - namespaceSelector: {matchLabels: {team: web}}
      - podSelector: {matchLabels: {app: backup}}
""")
    assert sources(policy) == {"web/frontend", "db/backup"}


def test_semantics_empty_namespace_selector_is_every_namespace() -> None:
    policy = knp("""
podSelector: {}
ingress: [{from: [{namespaceSelector: {}, podSelector: {matchLabels: {app: fe}}}]}]
""")
    assert sources(policy) == {"web/frontend", "other/intruder"}


def test_semantics_namespace_selector_by_name_label() -> None:
    policy = knp("""
podSelector: {}
ingress:
  - from:
      - namespaceSelector:
          matchExpressions: [{key: projectcalico.org/name, operator: NotIn, values: [web, db]}]
""")
    assert sources(policy) == {"other/intruder"}


def test_semantics_egress_destinations() -> None:
    policy = knp("""
podSelector: {matchLabels: {app: postgres}}
policyTypes: [Egress]
egress:
  - to:
      - podSelector: {matchLabels: {app: backup}}
      - namespaceSelector: {matchLabels: {team: web}}
""")
    matched: set[str] = set()
    for rule in policy.egress:
        matched |= peers_matched(rule.destination, policy.key.namespace)
    assert matched == {"db/backup", "web/frontend"}


# --- floating IPs -----------------------------------------------------------------------------


def _with_annotation(value: str) -> dict[str, Any]:
    doc = pod_doc()
    doc["metadata"].setdefault("annotations", {})["cni.projectcalico.org/floatingIPs"] = value
    return doc


def test_floating_ips_annotation_becomes_ip_nats_to_the_first_ip_of_the_family() -> None:
    from pyfelix.agent.model import IPNAT

    parsed = parse_resource(_with_annotation('["192.0.2.5", "2001:db8::5"]'))
    assert isinstance(parsed, Pod)
    wep = pod_to_workload_endpoint(parsed)
    assert wep is not None
    assert wep.ip_nats == (IPNAT("10.65.0.10", "192.0.2.5"), IPNAT("fd00:65::10", "2001:db8::5"))
    assert pod_to_workload_endpoint(pod()).ip_nats == ()  # type: ignore[union-attr]


@pytest.mark.parametrize("value", ['["10.0.0.300"]', '{"ip": "1.2.3.4"}', "not json"])
def test_bad_floating_ips_annotation_is_a_named_error(value: str) -> None:
    from pyfelix.agent.model.fields import ValidationError

    with pytest.raises(ValidationError, match=r"cni\.projectcalico\.org/floatingIPs"):
        parse_resource(_with_annotation(value))
