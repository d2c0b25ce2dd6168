"""Kubernetes NetworkPolicy conformance cases (after upstream's test/e2e/network/netpol).

Role: the networking.k8s.io/v1 half of the suite, as data. Each case's `ingress`/`egress`
predicates are the expected behaviour from the Kubernetes NetworkPolicy documentation:

- a pod selected by no policy of a direction is open in that direction; once selected, only
  what some rule of some selecting policy allows gets through (policies add up, never
  subtract);
- podSelector + namespaceSelector in ONE peer: both must match (AND); separate peers: any
  (OR); a peer with only podSelector means the policy's own namespace;
- ports without protocol are TCP; a named port is resolved on the destination pod; endPort
  makes a range; ipBlock `except` carves out of `cidr`;
- Pods with no Pod document have no endpoint: the node drops their traffic (Calico).

The order matters where a case `follows` another: it changes that case's state in place.
"""

from __future__ import annotations

from functools import partial

from pyfelix.lab.conformance.case import Case
from pyfelix.lab.conformance.resources import (
    any_port,
    expr,
    k8s_rule,
    knp,
    labels,
    peer,
    port,
)
from pyfelix.lab.conformance.world import (
    ICMP_ECHO,
    TCP_80,
    TCP_81,
    UDP_80,
    WITH_ICMP,
    WorldChange,
)

K8sCase = partial(Case, group="kubernetes")
BOTH = ("Ingress", "Egress")
EGRESS = ("Egress",)


def _ingress_rule(*peers: dict, ports: list[dict] | None = None) -> dict:
    return k8s_rule(list(peers) if peers else None, ports)


def _egress_rule(*peers: dict, ports: list[dict] | None = None) -> dict:
    return k8s_rule(list(peers) if peers else None, ports, egress=True)


CASES: list[Case] = [
    # --- nothing, default deny, allow all ---------------------------------------------------
    K8sCase("k8s-baseline-no-policy", "no policy anywhere: every pod reaches every pod",
         columns=WITH_ICMP),
    K8sCase("k8s-default-deny-ingress", "x: podSelector {} with no ingress rules",
         resources=(knp("deny-ingress", "x", labels()),),
         ingress=lambda s, d, c: d.namespace != "x"),
    K8sCase("k8s-default-deny-egress", "x: podSelector {} with no egress rules",
         resources=(knp("deny-egress", "x", labels(), types=EGRESS),),
         egress=lambda s, d, c: s.namespace != "x"),
    K8sCase("k8s-default-deny-all", "x: podSelector {} denying ingress and egress (ICMP too)",
         resources=(knp("deny-all", "x", labels(), types=BOTH),),
         ingress=lambda s, d, c: d.namespace != "x",
         egress=lambda s, d, c: s.namespace != "x", columns=WITH_ICMP),
    K8sCase("k8s-policy-deleted", "deny-all in x is deleted: live traffic flows again",
         follows="k8s-default-deny-all"),
    K8sCase("k8s-deny-everywhere", "a deny-ingress policy in every namespace: nothing connects",
         resources=tuple(knp("deny-ingress", ns, labels()) for ns in ("x", "y", "z")),
         ingress=lambda s, d, c: False, columns=WITH_ICMP),
    K8sCase("k8s-allow-all-ingress-union", "x: deny-ingress plus an ingress: [{}] policy",
         resources=(knp("deny-ingress", "x", labels()),
                    knp("allow-all-ingress", "x", labels(), ingress=[_ingress_rule()]))),
    K8sCase("k8s-allow-all-egress-union", "x: deny-egress plus an egress: [{}] policy",
         resources=(knp("deny-egress", "x", labels(), types=EGRESS),
                    knp("allow-all-egress", "x", labels(), types=EGRESS,
                        egress=[_egress_rule()]))),
    # --- pod selectors and live changes of policies and labels ---------------------------
    K8sCase("k8s-pod-selector", "x/a admits pods labelled pod=b of its own namespace",
         resources=(knp("allow-from-b", "x", labels(pod="a"),
                        ingress=[_ingress_rule(peer(pods=labels(pod="b")))]),),
         ingress=lambda s, d, c: d.key != "x/a" or s.key == "x/b"),
    K8sCase("k8s-pod-relabel-source", "x/c is relabelled pod=b while allow-from-b is live",
         resources=(knp("allow-from-b", "x", labels(pod="a"),
                        ingress=[_ingress_rule(peer(pods=labels(pod="b")))]),),
         world_change=WorldChange(pod_labels={"x/c": {"pod": "b"}}),
         ingress=lambda s, d, c: d.key != "x/a" or (
             s.namespace == "x" and s.labels.get("pod") == "b"),
         follows="k8s-pod-selector"),
    K8sCase("k8s-policy-update", "allow-from-b is updated in place to admit pod=c; x/c's "
         "labels are restored",
         resources=(knp("allow-from-b", "x", labels(pod="a"),
                        ingress=[_ingress_rule(peer(pods=labels(pod="c")))]),),
         ingress=lambda s, d, c: d.key != "x/a" or s.key == "x/c",
         follows="k8s-pod-relabel-source"),
    K8sCase("k8s-pod-selector-in-target", "y: deny ingress to pods with pod In (a, b)",
         resources=(knp("deny-ab", "y", expr("pod", "In", "a", "b")),),
         ingress=lambda s, d, c: not (d.namespace == "y" and d.name in ("a", "b"))),
    K8sCase("k8s-pod-relabel-target", "y/a relabelled pod=c and y/c pod=a under deny-ab",
         resources=(knp("deny-ab", "y", expr("pod", "In", "a", "b")),),
         world_change=WorldChange(pod_labels={"y/a": {"pod": "c"}, "y/c": {"pod": "a"}}),
         ingress=lambda s, d, c: not (
             d.namespace == "y" and d.labels.get("pod") in ("a", "b")),
         follows="k8s-pod-selector-in-target"),
    # --- namespace selectors, AND / OR, matchExpressions -----------------------------------
    K8sCase("k8s-namespace-selector", "x/a admits every pod of namespaces labelled ns=y",
         resources=(knp("allow-from-y", "x", labels(pod="a"),
                        ingress=[_ingress_rule(peer(namespaces=labels(ns="y")))]),),
         ingress=lambda s, d, c: d.key != "x/a" or s.namespace == "y"),
    K8sCase("k8s-and-peer", "x/a admits one peer {namespaceSelector ns=y AND podSelector pod=b}",
         resources=(knp("allow-y-b", "x", labels(pod="a"), ingress=[_ingress_rule(
             peer(namespaces=labels(ns="y"), pods=labels(pod="b")))]),),
         ingress=lambda s, d, c: d.key != "x/a" or s.key == "y/b"),
    K8sCase("k8s-or-peers", "x/a admits two peers: namespaceSelector ns=y OR podSelector pod=b",
         resources=(knp("allow-y-or-b", "x", labels(pod="a"), ingress=[_ingress_rule(
             peer(namespaces=labels(ns="y")), peer(pods=labels(pod="b")))]),),
         ingress=lambda s, d, c: d.key != "x/a" or s.namespace == "y" or s.key == "x/b"),
    K8sCase("k8s-match-expressions-in", "x/a admits namespaces with ns In (y, z)",
         resources=(knp("allow-in-yz", "x", labels(pod="a"), ingress=[_ingress_rule(
             peer(namespaces=expr("ns", "In", "y", "z")))]),),
         ingress=lambda s, d, c: d.key != "x/a" or s.namespace in ("y", "z")),
    K8sCase("k8s-match-expressions-notin", "x/a admits namespaces with ns NotIn (y)",
         resources=(knp("allow-notin-y", "x", labels(pod="a"), ingress=[_ingress_rule(
             peer(namespaces=expr("ns", "NotIn", "y")))]),),
         ingress=lambda s, d, c: d.key != "x/a" or s.namespace != "y"),
    K8sCase("k8s-match-expressions-exists", "x admits pods of any namespace where app Exists",
         resources=(knp("allow-app", "x", labels(), ingress=[_ingress_rule(
             peer(namespaces=labels(), pods=expr("app", "Exists")))]),),
         ingress=lambda s, d, c: d.namespace != "x" or "app" in s.labels),
    K8sCase("k8s-match-expressions-doesnotexist",
         "x admits pods of any namespace where app DoesNotExist",
         resources=(knp("allow-no-app", "x", labels(), ingress=[_ingress_rule(
             peer(namespaces=labels(), pods=expr("app", "DoesNotExist")))]),),
         ingress=lambda s, d, c: d.namespace != "x" or "app" not in s.labels),
    K8sCase("k8s-all-namespaces-pod-a", "x/c admits pod=a from every namespace ({} selector)",
         resources=(knp("allow-any-a", "x", labels(pod="c"), ingress=[_ingress_rule(
             peer(namespaces=labels(), pods=labels(pod="a")))]),),
         ingress=lambda s, d, c: d.key != "x/c" or s.labels.get("pod") == "a"),
    K8sCase("k8s-namespace-relabel-before", "x/a admits namespaces labelled team=blue (none)",
         resources=(knp("allow-blue", "x", labels(pod="a"),
                        ingress=[_ingress_rule(peer(namespaces=labels(team="blue")))]),),
         ingress=lambda s, d, c: d.key != "x/a"),
    K8sCase("k8s-namespace-relabel", "namespace z gains team=blue while allow-blue is live",
         resources=(knp("allow-blue", "x", labels(pod="a"),
                        ingress=[_ingress_rule(peer(namespaces=labels(team="blue")))]),),
         world_change=WorldChange(namespace_labels={"z": {"ns": "z", "team": "blue"}}),
         ingress=lambda s, d, c: d.key != "x/a" or s.namespace_labels.get("team") == "blue",
         follows="k8s-namespace-relabel-before"),
    # --- ports and protocols ---------------------------------------------------------------
    K8sCase("k8s-port-tcp-80", "x/a admits anyone on TCP 80 only",
         resources=(knp("tcp-80", "x", labels(pod="a"),
                        ingress=[_ingress_rule(ports=[port(80)])]),),
         ingress=lambda s, d, c: d.key != "x/a" or c == TCP_80),
    K8sCase("k8s-named-port-tcp", "x admits anyone on named port serve-81-tcp",
         resources=(knp("named-81", "x", labels(),
                        ingress=[_ingress_rule(ports=[port("serve-81-tcp")])]),),
         ingress=lambda s, d, c: d.namespace != "x" or c == TCP_81),
    K8sCase("k8s-named-port-udp", "x/a admits anyone on named port serve-80-udp (UDP)",
         resources=(knp("named-udp", "x", labels(pod="a"),
                        ingress=[_ingress_rule(ports=[port("serve-80-udp", "UDP")])]),),
         ingress=lambda s, d, c: d.key != "x/a" or c == UDP_80),
    K8sCase("k8s-end-port", "x/a admits TCP 80-81 (port 80, endPort 81)",
         resources=(knp("tcp-80-81", "x", labels(pod="a"),
                        ingress=[_ingress_rule(ports=[port(80, end=81)])]),),
         ingress=lambda s, d, c: d.key != "x/a" or c in (TCP_80, TCP_81)),
    K8sCase("k8s-end-port-partial", "x admits TCP 81-90 and UDP 80 (so not TCP 80)",
         resources=(knp("tcp-81-90", "x", labels(), ingress=[_ingress_rule(
             ports=[port(81, end=90), port(80, "UDP")])]),),
         ingress=lambda s, d, c: d.namespace != "x" or c in (TCP_81, UDP_80)),
    K8sCase("k8s-protocol-udp", "x/a admits UDP on any port, no TCP",
         resources=(knp("udp-any", "x", labels(pod="a"),
                        ingress=[_ingress_rule(ports=[any_port("UDP")])]),),
         ingress=lambda s, d, c: d.key != "x/a" or c.protocol == "UDP"),
    K8sCase("k8s-union-two-policies", "x/a: pod=b on TCP 80 (one policy) + ns=z on TCP 81 "
         "(another)",
         resources=(knp("b-on-80", "x", labels(pod="a"), ingress=[_ingress_rule(
                        peer(pods=labels(pod="b")), ports=[port(80)])]),
                    knp("z-on-81", "x", labels(pod="a"), ingress=[_ingress_rule(
                        peer(namespaces=labels(ns="z")), ports=[port(81)])])),
         ingress=lambda s, d, c: d.key != "x/a" or (s.key == "x/b" and c == TCP_80)
         or (s.namespace == "z" and c == TCP_81)),
    # --- ipBlock ---------------------------------------------------------------------------
    K8sCase("k8s-ipblock-except", "x/a admits 10.65.0.0/16 except 10.65.2.0/24 (namespace y)",
         resources=(knp("cidr-not-y", "x", labels(pod="a"), ingress=[_ingress_rule(
             peer(cidr="10.65.0.0/16", except_=["10.65.2.0/24"]))]),),
         ingress=lambda s, d, c: d.key != "x/a" or (
             s.in_net("10.65.0.0/16") and not s.in_net("10.65.2.0/24"))),
    K8sCase("k8s-ipblock-except-host", "x/a admits 10.65.3.0/24 except 10.65.3.11/32 (z/b)",
         resources=(knp("cidr-z-not-b", "x", labels(pod="a"), ingress=[_ingress_rule(
             peer(cidr="10.65.3.0/24", except_=["10.65.3.11/32"]))]),),
         ingress=lambda s, d, c: d.key != "x/a" or (
             s.in_net("10.65.3.0/24") and not s.in_net("10.65.3.11/32"))),
    K8sCase("k8s-ipblock-or-pod", "x/a admits ipBlock 10.65.2.10/32 (y/a) OR podSelector pod=c",
         resources=(knp("cidr-or-c", "x", labels(pod="a"), ingress=[_ingress_rule(
             peer(cidr="10.65.2.10/32"), peer(pods=labels(pod="c")))]),),
         ingress=lambda s, d, c: d.key != "x/a" or s.in_net("10.65.2.10/32")
         or s.key == "x/c"),
    # --- egress ----------------------------------------------------------------------------
    K8sCase("k8s-egress-to-pods", "x/a may only connect to {ns=y AND pod=b}",
         resources=(knp("egress-y-b", "x", labels(pod="a"), types=EGRESS, egress=[
             _egress_rule(peer(namespaces=labels(ns="y"), pods=labels(pod="b")))]),),
         egress=lambda s, d, c: s.key != "x/a" or d.key == "y/b"),
    K8sCase("k8s-egress-to-cidr", "x/a may only connect to 10.65.3.0/24 (namespace z)",
         resources=(knp("egress-cidr-z", "x", labels(pod="a"), types=EGRESS,
                        egress=[_egress_rule(peer(cidr="10.65.3.0/24"))]),),
         egress=lambda s, d, c: s.key != "x/a" or d.in_net("10.65.3.0/24")),
    K8sCase("k8s-egress-cidr-except-port",
         "x may connect to 10.65.0.0/16 except 10.65.1.0/24 on TCP 80 only",
         resources=(knp("egress-out-80", "x", labels(), types=EGRESS, egress=[_egress_rule(
             peer(cidr="10.65.0.0/16", except_=["10.65.1.0/24"]), ports=[port(80)])]),),
         egress=lambda s, d, c: s.namespace != "x" or (
             d.in_net("10.65.0.0/16") and not d.in_net("10.65.1.0/24") and c == TCP_80)),
    K8sCase("k8s-egress-named-port", "x may connect anywhere on named port serve-80-tcp",
         resources=(knp("egress-named", "x", labels(), types=EGRESS,
                        egress=[_egress_rule(ports=[port("serve-80-tcp")])]),),
         egress=lambda s, d, c: s.namespace != "x" or c == TCP_80),
    K8sCase("k8s-egress-deny-allow-udp", "x: deny-egress + egress to ns=y on UDP 80",
         resources=(knp("deny-egress", "x", labels(), types=EGRESS),
                    knp("udp-to-y", "x", labels(), types=EGRESS, egress=[_egress_rule(
                        peer(namespaces=labels(ns="y")), ports=[port(80, "UDP")])])),
         egress=lambda s, d, c: s.namespace != "x" or (d.namespace == "y" and c == UDP_80)),
    K8sCase("k8s-ingress-and-egress", "y: ingress only from ns=x, egress only to ns=z (one "
         "policy)",
         resources=(knp("in-x-out-z", "y", labels(), types=BOTH,
                        ingress=[_ingress_rule(peer(namespaces=labels(ns="x")))],
                        egress=[_egress_rule(peer(namespaces=labels(ns="z")))]),),
         ingress=lambda s, d, c: d.namespace != "y" or s.namespace == "x",
         egress=lambda s, d, c: s.namespace != "y" or d.namespace == "z"),
    K8sCase("k8s-ingress-icmp-denied", "x/b admits TCP and UDP only: ICMP is not a port",
         resources=(knp("tcp-udp", "x", labels(pod="b"), ingress=[_ingress_rule(
             ports=[any_port("TCP"), any_port("UDP")])]),),
         ingress=lambda s, d, c: d.key != "x/b" or c != ICMP_ECHO, columns=WITH_ICMP),
    # --- endpoints that go away and come back ----------------------------------------------
    K8sCase("k8s-pod-absent", "x/b has no Pod document (no endpoint): its traffic is dropped",
         world_change=WorldChange(absent=frozenset({"x/b"}))),
    K8sCase("k8s-pod-added-before", "x/a admits pod=b, but x/b has no Pod document yet",
         resources=(knp("allow-from-b", "x", labels(pod="a"),
                        ingress=[_ingress_rule(peer(pods=labels(pod="b")))]),),
         world_change=WorldChange(absent=frozenset({"x/b"})),
         ingress=lambda s, d, c: d.key != "x/a" or s.key == "x/b"),
    K8sCase("k8s-pod-added-after-policy", "x/b's Pod appears after the policy: it is admitted",
         resources=(knp("allow-from-b", "x", labels(pod="a"),
                        ingress=[_ingress_rule(peer(pods=labels(pod="b")))]),),
         ingress=lambda s, d, c: d.key != "x/a" or s.key == "x/b",
         follows="k8s-pod-added-before"),
]
