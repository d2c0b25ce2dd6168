"""Calico-specific conformance cases: order, Deny/Pass, tiers, profiles, network sets, ...

Role: the projectcalico.org/v3 half of the suite, as data. The expected behaviour written in
each case's predicates follows Calico's policy documentation:

- per direction, an endpoint's tiers are walked in tier `order` (the default tier, which
  holds Kubernetes policies at order 1000, comes last); within a tier, policies by `order`,
  then by name; within a policy, rules in order; the first Allow or Deny decides;
- Log does not decide; Pass ends the tier and continues with the next one;
- a tier in which some policy selects the endpoint but no rule decided ends with the tier's
  defaultAction (Deny unless the Tier says Pass);
- after the last tier (or when no policy selects the endpoint), the endpoint's profiles
  decide: a Kubernetes namespace's profile (`kns.<ns>`) allows everything;
- in a GlobalNetworkPolicy a rule selector matches endpoints of every namespace and global
  network sets; in a namespaced NetworkPolicy, only endpoints and NetworkSets of its own
  namespace, unless namespaceSelector widens it (`global()` means non-namespaced objects);
- notNets / notSelector / notPorts / notProtocol match what the positive form does not.
"""

from __future__ import annotations

from functools import partial

from pyfelix.lab.conformance.case import Case
from pyfelix.lab.conformance.resources import (
    cnp,
    global_network_set,
    gnp,
    knp,
    labels,
    network_set,
    peer,
    rule,
    service_account,
    tier,
)
from pyfelix.lab.conformance.world import (
    ICMP_ECHO,
    TCP_80,
    TCP_81,
    UDP_80,
    WITH_ICMP,
    WorldChange,
)

CalicoCase = partial(Case, group="calico")
NS_X = "ns == 'x'"


def _from_ns(namespace: str) -> dict[str, str]:
    return {"namespaceSelector": f"ns == '{namespace}'"}


_SERVICE_ACCOUNTS = WorldChange(service_accounts={"x/a": "admin", "y/a": "admin"})
_SERVICE_ACCOUNT_DOCS = (service_account("admin", "x", role="admin"),
                         service_account("admin", "y", role="ops"))

CASES: list[Case] = [
    # --- order within a tier ----------------------------------------------------------------
    CalicoCase("calico-order-deny-before-allow",
               "x: Deny from ns z (order 10) before Allow all (order 20)",
               resources=(gnp("deny-z", namespace_selector=NS_X, order=10,
                              ingress=[rule("Deny", source=_from_ns("z"))]),
                          gnp("allow-rest", namespace_selector=NS_X, order=20,
                              ingress=[rule("Allow")])),
               ingress=lambda s, d, c: d.namespace != "x" or s.namespace != "z"),
    CalicoCase("calico-order-update", "deny-z's order is changed in place to 30: allow-rest "
               "now decides first",
               resources=(gnp("deny-z", namespace_selector=NS_X, order=30,
                              ingress=[rule("Deny", source=_from_ns("z"))]),
                          gnp("allow-rest", namespace_selector=NS_X, order=20,
                              ingress=[rule("Allow")])),
               follows="calico-order-deny-before-allow"),
    CalicoCase("calico-order-three-policies",
               "x: Allow TCP (10), Deny from z (20), Allow (30): z may use TCP only",
               resources=(gnp("allow-tcp", namespace_selector=NS_X, order=10,
                              ingress=[rule("Allow", protocol="TCP")]),
                          gnp("deny-z-20", namespace_selector=NS_X, order=20,
                              ingress=[rule("Deny", source=_from_ns("z"))]),
                          gnp("allow-all-30", namespace_selector=NS_X, order=30,
                              ingress=[rule("Allow")])),
               ingress=lambda s, d, c: d.namespace != "x" or c.protocol == "TCP"
               or s.namespace != "z"),
    CalicoCase("calico-order-tie-by-name",
               "x/a: aa-deny-y and bb-allow both at order 100: the name decides (aa first)",
               resources=(gnp("bb-allow", selector="pod == 'a'", namespace_selector=NS_X,
                              order=100, ingress=[rule("Allow")]),
                          gnp("aa-deny-y", selector="pod == 'a'", namespace_selector=NS_X,
                              order=100, ingress=[rule("Deny", source=_from_ns("y"))])),
               ingress=lambda s, d, c: d.key != "x/a" or s.namespace != "y"),
    CalicoCase("calico-rule-order", "x: one policy, Deny from pod=a then Allow",
               resources=(gnp("deny-a-first", namespace_selector=NS_X, ingress=[
                   rule("Deny", source={"selector": "pod == 'a'"}), rule("Allow")]),),
               ingress=lambda s, d, c: d.namespace != "x" or s.labels.get("pod") != "a"),
    CalicoCase("calico-log-is-not-a-verdict", "x: Log from z, Deny from z, Allow",
               resources=(gnp("log-deny-z", namespace_selector=NS_X, ingress=[
                   rule("Log", source=_from_ns("z")), rule("Deny", source=_from_ns("z")),
                   rule("Allow")]),),
               ingress=lambda s, d, c: d.namespace != "x" or s.namespace != "z"),
    CalicoCase("calico-no-rule-matches", "x: a policy whose only rule allows ns y: the "
               "rest ends at the tier's default Deny",
               resources=(gnp("only-y", namespace_selector=NS_X,
                              ingress=[rule("Allow", source=_from_ns("y"))]),),
               ingress=lambda s, d, c: d.namespace != "x" or s.namespace == "y"),
    # --- Pass, tiers, profiles ---------------------------------------------------------------
    CalicoCase("calico-pass-to-profile", "x: Pass from ns y (default tier): the namespace "
               "profile allows it; the rest is denied",
               resources=(gnp("pass-y", namespace_selector=NS_X,
                              ingress=[rule("Pass", source=_from_ns("y"))]),),
               ingress=lambda s, d, c: d.namespace != "x" or s.namespace == "y"),
    CalicoCase("calico-pass-to-k8s-policy", "tier security: x allows ns x, passes ns y to "
               "the default tier (k8s policy admits y/a), z ends the tier",
               resources=(tier("security", 100),
                          gnp("security.pass-y", tier="security", namespace_selector=NS_X,
                              ingress=[rule("Pass", source=_from_ns("y")),
                                       rule("Allow", source=_from_ns("x"))]),
                          knp("from-y-a", "x", labels(), ingress=[{"from": [
                              peer(namespaces=labels(ns="y"), pods=labels(pod="a"))]}])),
               ingress=lambda s, d, c: d.namespace != "x" or s.namespace == "x"
               or s.key == "y/a"),
    CalicoCase("calico-tier-deny-beats-lower-allow", "tier security denies ns z, passes "
               "the rest; the default tier allows all",
               resources=(tier("security", 100),
                          gnp("security.deny-z", tier="security", ingress=[
                              rule("Deny", source=_from_ns("z")), rule("Pass")]),
                          gnp("allow-everything", ingress=[rule("Allow")])),
               ingress=lambda s, d, c: s.namespace != "z"),
    CalicoCase("calico-tier-allow-beats-k8s-deny", "tier security allows ns y into x; a k8s "
               "deny-ingress in x covers the rest",
               resources=(tier("security", 100),
                          gnp("security.allow-y", tier="security", namespace_selector=NS_X,
                              ingress=[rule("Allow", source=_from_ns("y")), rule("Pass")]),
                          knp("deny-ingress", "x", labels())),
               ingress=lambda s, d, c: d.namespace != "x" or s.namespace == "y"),
    CalicoCase("calico-tier-order", "tier first (10) allows ns y then passes; tier second "
               "(20) denies all into x",
               resources=(tier("first", 10), tier("second", 20),
                          gnp("first.allow-y", tier="first", namespace_selector=NS_X,
                              ingress=[rule("Allow", source=_from_ns("y")), rule("Pass")]),
                          gnp("second.deny-all", tier="second", namespace_selector=NS_X,
                              ingress=[])),
               ingress=lambda s, d, c: d.namespace != "x" or s.namespace == "y"),
    CalicoCase("calico-tier-order-swapped", "the tiers' orders are swapped in place: "
               "second (now 5) denies everything first",
               resources=(tier("first", 10), tier("second", 5),
                          gnp("first.allow-y", tier="first", namespace_selector=NS_X,
                              ingress=[rule("Allow", source=_from_ns("y")), rule("Pass")]),
                          gnp("second.deny-all", tier="second", namespace_selector=NS_X,
                              ingress=[])),
               ingress=lambda s, d, c: d.namespace != "x",
               follows="calico-tier-order"),
    CalicoCase("calico-tier-policy-deleted", "first.allow-y is deleted; second.deny-all "
               "stays",
               resources=(tier("first", 10), tier("second", 5),
                          gnp("second.deny-all", tier="second", namespace_selector=NS_X,
                              ingress=[])),
               ingress=lambda s, d, c: d.namespace != "x",
               follows="calico-tier-order-swapped"),
    CalicoCase("calico-tier-default-pass", "tier passive (defaultAction Pass) allows ns z; "
               "unmatched traffic passes to a k8s policy admitting ns y",
               resources=(tier("passive", 50, "Pass"),
                          gnp("passive.allow-z", tier="passive", namespace_selector=NS_X,
                              ingress=[rule("Allow", source=_from_ns("z"))]),
                          knp("from-y", "x", labels(),
                              ingress=[{"from": [peer(namespaces=labels(ns="y"))]}])),
               ingress=lambda s, d, c: d.namespace != "x" or s.namespace in ("y", "z")),
    CalicoCase("calico-tier-default-deny", "the passive tier's defaultAction is changed in "
               "place to Deny: ns y is no longer passed on",
               resources=(tier("passive", 50, "Deny"),
                          gnp("passive.allow-z", tier="passive", namespace_selector=NS_X,
                              ingress=[rule("Allow", source=_from_ns("z"))]),
                          knp("from-y", "x", labels(),
                              ingress=[{"from": [peer(namespaces=labels(ns="y"))]}])),
               ingress=lambda s, d, c: d.namespace != "x" or s.namespace == "z",
               follows="calico-tier-default-pass"),
    # --- service accounts (profiles' labels) ---------------------------------------------
    CalicoCase("calico-service-account-selector", "z admits pods whose service account has "
               "role=admin (x/a; y/a's account is role=ops)",
               resources=(*_SERVICE_ACCOUNT_DOCS,
                          gnp("sa-admins", namespace_selector="ns == 'z'", ingress=[
                              rule("Allow", source={"serviceAccounts": {
                                  "selector": "role == 'admin'"}})])),
               world_change=_SERVICE_ACCOUNTS,
               ingress=lambda s, d, c: d.namespace != "z" or (
                   s.service_account == "admin" and s.namespace == "x")),
    CalicoCase("calico-service-account-names", "z admits pods running as service account "
               "admin (x/a and y/a)",
               resources=(*_SERVICE_ACCOUNT_DOCS,
                          gnp("sa-named-admin", namespace_selector="ns == 'z'", ingress=[
                              rule("Allow", source={"serviceAccounts": {
                                  "names": ["admin"]}})])),
               world_change=_SERVICE_ACCOUNTS,
               ingress=lambda s, d, c: d.namespace != "z" or s.service_account == "admin"),
    CalicoCase("calico-service-account-policy-selector", "a policy selecting endpoints by "
               "serviceAccountSelector role=admin denies them all ingress",
               resources=(*_SERVICE_ACCOUNT_DOCS,
                          gnp("deny-admins", service_account_selector="role == 'admin'",
                              ingress=[])),
               world_change=_SERVICE_ACCOUNTS,
               ingress=lambda s, d, c: not (d.service_account == "admin"
                                            and d.namespace == "x")),
    # --- network sets ----------------------------------------------------------------------
    CalicoCase("calico-global-network-set", "x admits a GlobalNetworkSet labelled "
               "netset=trusted: 10.65.2.10/32 (y/a) and 10.65.3.0/24 (z)",
               resources=(global_network_set("trusted", ["10.65.2.10/32", "10.65.3.0/24"],
                                             netset="trusted"),
                          gnp("from-trusted", namespace_selector=NS_X, ingress=[
                              rule("Allow", source={"selector": "netset == 'trusted'"})])),
               ingress=lambda s, d, c: d.namespace != "x" or s.in_net("10.65.2.10/32")
               or s.in_net("10.65.3.0/24")),
    CalicoCase("calico-global-network-set-update", "the set's nets change in place to "
               "10.65.2.11/32 (y/b)",
               resources=(global_network_set("trusted", ["10.65.2.11/32"], netset="trusted"),
                          gnp("from-trusted", namespace_selector=NS_X, ingress=[
                              rule("Allow", source={"selector": "netset == 'trusted'"})])),
               ingress=lambda s, d, c: d.namespace != "x" or s.in_net("10.65.2.11/32"),
               follows="calico-global-network-set"),
    CalicoCase("calico-global-network-set-relabel", "the set is relabelled netset=other: "
               "the selector no longer matches it",
               resources=(global_network_set("trusted", ["10.65.2.11/32"], netset="other"),
                          gnp("from-trusted", namespace_selector=NS_X, ingress=[
                              rule("Allow", source={"selector": "netset == 'trusted'"})])),
               ingress=lambda s, d, c: d.namespace != "x",
               follows="calico-global-network-set-update"),
    CalicoCase("calico-namespaced-network-set", "x/a admits a NetworkSet of x labelled "
               "netset=friends (10.65.3.12/32, z/c)",
               resources=(network_set("friends", "x", ["10.65.3.12/32"], netset="friends"),
                          cnp("from-friends", "x", selector="pod == 'a'", ingress=[
                              rule("Allow", source={"selector": "netset == 'friends'"})])),
               ingress=lambda s, d, c: d.key != "x/a" or s.in_net("10.65.3.12/32")),
    CalicoCase("calico-global-set-from-namespaced-policy", "x/b admits namespaceSelector "
               "global() + netset=trusted: the global set (10.65.2.0/24), not x's own set "
               "with the same label (10.65.3.12/32)",
               resources=(global_network_set("trusted", ["10.65.2.0/24"], netset="trusted"),
                          network_set("local-trusted", "x", ["10.65.3.12/32"],
                                      netset="trusted"),
                          cnp("from-global-trusted", "x", selector="pod == 'b'", ingress=[
                              rule("Allow", source={"namespaceSelector": "global()",
                                                    "selector": "netset == 'trusted'"})])),
               ingress=lambda s, d, c: d.key != "x/b" or s.in_net("10.65.2.0/24")),
    # --- nets, notNets, notSelector, selector scope ----------------------------------------
    CalicoCase("calico-not-nets", "x admits sources in notNets 10.65.2.0/24 (all but y)",
               resources=(gnp("not-y-net", namespace_selector=NS_X, ingress=[
                   rule("Allow", source={"notNets": ["10.65.2.0/24"]})]),),
               ingress=lambda s, d, c: d.namespace != "x" or not s.in_net("10.65.2.0/24")),
    CalicoCase("calico-nets-and-not-nets", "y admits nets 10.65.0.0/16 minus notNets "
               "10.65.1.10/32 and 10.65.3.0/24",
               resources=(gnp("nets-minus", namespace_selector="ns == 'y'", ingress=[
                   rule("Allow", source={"nets": ["10.65.0.0/16"],
                                         "notNets": ["10.65.1.10/32", "10.65.3.0/24"]})]),),
               ingress=lambda s, d, c: d.namespace != "y" or (
                   s.in_net("10.65.0.0/16") and not s.in_net("10.65.1.10/32")
                   and not s.in_net("10.65.3.0/24"))),
    CalicoCase("calico-not-selector", "x admits sources matching notSelector pod == 'a'",
               resources=(gnp("not-a", namespace_selector=NS_X, ingress=[
                   rule("Allow", source={"notSelector": "pod == 'a'"})]),),
               ingress=lambda s, d, c: d.namespace != "x" or s.labels.get("pod") != "a"),
    CalicoCase("calico-namespaced-selector-scope", "a NetworkPolicy in x admits selector "
               "pod == 'b': only x/b (its own namespace)",
               resources=(cnp("from-b", "x", ingress=[
                   rule("Allow", source={"selector": "pod == 'b'"})]),),
               ingress=lambda s, d, c: d.namespace != "x" or s.key == "x/b"),
    CalicoCase("calico-namespaced-namespace-selector", "a NetworkPolicy in x admits "
               "namespaceSelector ns == 'z' and selector pod == 'c'",
               resources=(cnp("from-z-c", "x", ingress=[
                   rule("Allow", source={"namespaceSelector": "ns == 'z'",
                                         "selector": "pod == 'c'"})]),),
               ingress=lambda s, d, c: d.namespace != "x" or s.key == "z/c"),
    CalicoCase("calico-policy-namespace-selector", "a GlobalNetworkPolicy for namespace y "
               "(policy namespaceSelector) denies ns x, allows the rest",
               resources=(gnp("y-not-from-x", namespace_selector="ns == 'y'", ingress=[
                   rule("Deny", source=_from_ns("x")), rule("Allow")]),),
               ingress=lambda s, d, c: d.namespace != "y" or s.namespace != "x"),
    CalicoCase("calico-selector-namespace-label", "selector projectcalico.org/namespace == "
               "'z' && has(app) closes z/a and z/b",
               resources=(gnp("close-z-web",
                              selector="projectcalico.org/namespace == 'z' && has(app)",
                              ingress=[]),),
               ingress=lambda s, d, c: not (d.namespace == "z" and "app" in d.labels)),
    # --- ports and protocols ---------------------------------------------------------------
    CalicoCase("calico-not-ports", "x admits TCP except notPorts [80]",
               resources=(gnp("tcp-not-80", namespace_selector=NS_X, ingress=[
                   rule("Allow", protocol="TCP", destination={"notPorts": [80]})]),),
               ingress=lambda s, d, c: d.namespace != "x" or c == TCP_81),
    CalicoCase("calico-not-protocol", "x admits notProtocol TCP (UDP and ICMP)",
               resources=(gnp("not-tcp", namespace_selector=NS_X,
                              ingress=[rule("Allow", not_protocol="TCP")]),),
               ingress=lambda s, d, c: d.namespace != "x" or c.protocol != "TCP",
               columns=WITH_ICMP),
    CalicoCase("calico-port-range", "x/c admits TCP ports '80:81', nothing else",
               resources=(gnp("tcp-80-81", selector="pod == 'c'", namespace_selector=NS_X,
                              ingress=[rule("Allow", protocol="TCP",
                                            destination={"ports": ["80:81"]})]),),
               ingress=lambda s, d, c: d.key != "x/c" or c in (TCP_80, TCP_81)),
    CalicoCase("calico-named-port", "x admits UDP to named port serve-80-udp",
               resources=(gnp("udp-named", namespace_selector=NS_X, ingress=[
                   rule("Allow", protocol="UDP", destination={"ports": ["serve-80-udp"]})]),),
               ingress=lambda s, d, c: d.namespace != "x" or c == UDP_80),
    # --- ICMP ------------------------------------------------------------------------------
    CalicoCase("calico-icmp-deny", "x: Deny ICMP, then Allow",
               resources=(gnp("no-icmp", namespace_selector=NS_X, ingress=[
                   rule("Deny", protocol="ICMP"), rule("Allow")]),),
               ingress=lambda s, d, c: d.namespace != "x" or c != ICMP_ECHO,
               columns=WITH_ICMP),
    CalicoCase("calico-icmp-type", "x: Allow ICMP type 8 (echo request) and TCP 80 only",
               resources=(gnp("echo-and-80", namespace_selector=NS_X, ingress=[
                   rule("Allow", protocol="ICMP", icmp={"type": 8}),
                   rule("Allow", protocol="TCP", destination={"ports": [80]})]),),
               ingress=lambda s, d, c: d.namespace != "x" or c in (ICMP_ECHO, TCP_80),
               columns=WITH_ICMP),
    CalicoCase("calico-icmp-other-type", "the ICMP rule is changed in place to type 13 "
               "(timestamp): echo requests are denied",
               resources=(gnp("echo-and-80", namespace_selector=NS_X, ingress=[
                   rule("Allow", protocol="ICMP", icmp={"type": 13}),
                   rule("Allow", protocol="TCP", destination={"ports": [80]})]),),
               ingress=lambda s, d, c: d.namespace != "x" or c == TCP_80,
               columns=WITH_ICMP, follows="calico-icmp-type"),
    CalicoCase("calico-egress-icmp", "x may not send ICMP to ns y; everything else allowed",
               resources=(gnp("no-icmp-to-y", namespace_selector=NS_X, types=("Egress",),
                              egress=[rule("Deny", protocol="ICMP", destination=_from_ns("y")),
                                      rule("Allow")]),),
               egress=lambda s, d, c: s.namespace != "x" or not (
                   c == ICMP_ECHO and d.namespace == "y"),
               columns=WITH_ICMP),
    # --- egress ----------------------------------------------------------------------------
    CalicoCase("calico-egress-deny-nets", "x: egress Deny to nets 10.65.3.0/24, then Allow",
               resources=(gnp("x-not-to-z", namespace_selector=NS_X, types=("Egress",),
                              egress=[rule("Deny", destination={"nets": ["10.65.3.0/24"]}),
                                      rule("Allow")]),),
               egress=lambda s, d, c: s.namespace != "x" or not d.in_net("10.65.3.0/24")),
    CalicoCase("calico-egress-selector", "x may connect only to namespaceSelector ns == 'y' "
               "&& selector pod == 'c'",
               resources=(gnp("x-to-y-c", namespace_selector=NS_X, types=("Egress",),
                              egress=[rule("Allow", destination={
                                  "namespaceSelector": "ns == 'y'",
                                  "selector": "pod == 'c'"})]),),
               egress=lambda s, d, c: s.namespace != "x" or d.key == "y/c"),
    CalicoCase("calico-global-default-deny", "selector all(), Ingress and Egress, no "
               "rules: nothing connects",
               resources=(gnp("default-deny", types=("Ingress", "Egress"), ingress=[],
                              egress=[]),),
               ingress=lambda s, d, c: False, egress=lambda s, d, c: False,
               columns=WITH_ICMP),
    CalicoCase("calico-global-default-deny-update", "default-deny is changed in place: "
               "ingress Allow, egress only to 10.65.1.0/24 (x)",
               resources=(gnp("default-deny", types=("Ingress", "Egress"),
                              ingress=[rule("Allow")],
                              egress=[rule("Allow", destination={"nets": ["10.65.1.0/24"]})]),),
               egress=lambda s, d, c: d.in_net("10.65.1.0/24"),
               columns=WITH_ICMP, follows="calico-global-default-deny"),
]
