"""Property: a converted Kubernetes NetworkPolicy peer selects exactly the pods Kubernetes'
own NetworkPolicy semantics select.

Reference semantics (written from the Kubernetes API documentation, independent of the
conversion): a peer with only podSelector selects matching pods in the policy's namespace;
with only namespaceSelector, every pod in matching namespaces; with both, matching pods in
matching namespaces. A label selector matches when every matchLabels pair is present and
equal and every expression holds (In: present with a listed value; NotIn: absent or not
listed; Exists; DoesNotExist); the empty selector matches everything.

Ours: Namespace and Pod documents go through parse_resource + to_calico; endpoint labels are
the endpoint's own plus its profiles' labelsToApply; the peer is converted and its rule
entity evaluated with `entity_selector`, as the calc graph does.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pyfelix.agent import selector
from pyfelix.agent.conversion import k8s_policy_to_calico, to_calico
from pyfelix.agent.model import (
    K8sNetworkPolicy,
    LabelSelector,
    Profile,
    WorkloadEndpoint,
    entity_selector,
    inherited_labels,
    parse_resource,
)

NAMESPACES = ("ns-a", "ns-b", "ns-c")
KEYS = ("app", "tier", "team")
VALUES = ("x", "y", "z")

label_sets = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)
expressions = st.one_of(
    st.builds(lambda k, vs, op: {"key": k, "operator": op, "values": sorted(vs)},
              st.sampled_from(KEYS), st.sets(st.sampled_from(VALUES), min_size=1),
              st.sampled_from(["In", "NotIn"])),
    st.builds(lambda k, op: {"key": k, "operator": op}, st.sampled_from(KEYS),
              st.sampled_from(["Exists", "DoesNotExist"])),
)
label_selectors = st.builds(
    lambda labels, exprs: {**({"matchLabels": labels} if labels else {}),
                           **({"matchExpressions": exprs} if exprs else {})},
    label_sets, st.lists(expressions, max_size=2))
peers = st.one_of(
    st.builds(lambda p: {"podSelector": p}, label_selectors),
    st.builds(lambda n: {"namespaceSelector": n}, label_selectors),
    st.builds(lambda p, n: {"podSelector": p, "namespaceSelector": n}, label_selectors,
              label_selectors),
)
pods = st.lists(st.tuples(st.sampled_from(NAMESPACES), label_sets), min_size=1, max_size=6)
namespace_labels = st.fixed_dictionaries({ns: label_sets for ns in NAMESPACES})


def k8s_matches(sel: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in sel.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in sel.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def reference_selected(peer: dict[str, Any], policy_ns: str, ns_labels: dict[str, Any],
                       pod_list: list[tuple[str, dict[str, str]]]) -> set[int]:
    chosen = set()
    for i, (ns, labels) in enumerate(pod_list):
        if "namespaceSelector" in peer:
            ns_ok = k8s_matches(peer["namespaceSelector"], ns_labels[ns])
        else:
            ns_ok = ns == policy_ns
        pod_ok = k8s_matches(peer.get("podSelector", {}), labels)
        if ns_ok and pod_ok:
            chosen.add(i)
    return chosen


def converted_selected(peer: dict[str, Any], policy_ns: str, ns_labels: dict[str, Any],
                       pod_list: list[tuple[str, dict[str, str]]]) -> set[int]:
    profiles: dict[str, Profile] = {}
    for ns in NAMESPACES:
        doc = {"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": ns, "labels": ns_labels[ns]}}
        for converted in to_calico(parse_resource(doc)).values():
            assert isinstance(converted, Profile)
            profiles[converted.key.name] = converted
    endpoint_labels = {}
    for i, (ns, labels) in enumerate(pod_list):
        doc = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"pod-{i}", "namespace": ns, "labels": labels},
               "spec": {"nodeName": "n1"}, "status": {"podIP": f"10.0.0.{i + 1}"}}
        (wep,) = to_calico(parse_resource(doc)).values()
        assert isinstance(wep, WorkloadEndpoint)
        endpoint_labels[i] = inherited_labels(
            wep.meta.labels_dict,
            [dict(profiles[p].labels_to_apply) for p in wep.profiles if p in profiles])
    policy_doc = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                  "metadata": {"name": "p", "namespace": policy_ns},
                  "spec": {"podSelector": {}, "ingress": [{"from": [peer]}]}}
    parsed = parse_resource(policy_doc)
    assert isinstance(parsed, K8sNetworkPolicy)
    (rule,) = k8s_policy_to_calico(parsed).ingress
    compiled = selector.parse(entity_selector(rule.source, policy_ns))
    return {i for i, labels in endpoint_labels.items() if compiled.evaluate(labels)}


@settings(max_examples=300, deadline=None)
@given(peer=peers, policy_ns=st.sampled_from(NAMESPACES), ns_labels=namespace_labels,
       pod_list=pods)
def test_converted_peer_selects_what_kubernetes_selects(peer: dict[str, Any], policy_ns: str,
                                                        ns_labels: dict[str, Any],
                                                        pod_list: list[tuple[str, dict[str, str]]]
                                                        ) -> None:
    assert converted_selected(peer, policy_ns, ns_labels, pod_list) == \
        reference_selected(peer, policy_ns, ns_labels, pod_list)


@settings(max_examples=200, deadline=None)
@given(sel=label_selectors, labels=label_sets)
def test_converted_pod_selector_matches_like_kubernetes(sel: dict[str, Any],
                                                         labels: dict[str, str]) -> None:
    from pyfelix.agent.conversion import label_selector_to_calico
    from pyfelix.agent.model.kubernetes import LabelSelectorRequirement

    model = LabelSelector(
        tuple(sorted(sel.get("matchLabels", {}).items())),
        tuple(LabelSelectorRequirement(e["key"], e["operator"], tuple(e.get("values", ())))
              for e in sel.get("matchExpressions", [])))
    text = label_selector_to_calico(model, pods=False)
    assert selector.parse(text).evaluate(labels) == k8s_matches(sel, labels)
