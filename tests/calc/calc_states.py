"""Datastore states with the dataplane state each must produce on host `node1`.

Each sequence is a list of `State`s. The test module replays every sequence forwards,
reversed, with the empty state between states, squashed (all differences in one batch),
with updates shuffled one per batch, from a fresh start per state, and with the naive
all-pairs selector index: the expected dataplane state must come out every time.
Addresses: node1 pods 10.65.0.x, node2 10.65.1.x, node3 10.65.2.x.
"""

from __future__ import annotations

from calc_testlib import (
    ALLOW,
    Expect,
    State,
    block,
    ep,
    global_netset,
    gnp,
    hep,
    ip_pool,
    k8s_np,
    named,
    namespace,
    netset,
    node,
    np,
    pod,
    profile,
    sel,
    tier,
    wep,
)

# --- profiles, label inheritance, member de-duplication ----------------------------------

_open = profile("open", ingress=[ALLOW], egress=[ALLOW])
_open_red = profile("open", labels_to_apply={"team": "red"}, ingress=[ALLOW], egress=[ALLOW])
_db1 = wep("prod", "db1", "node1", "10.65.0.1", labels={"role": "db"}, profiles=["open"])
_g_db = gnp("g-db", "role == 'db'",
            ingress=[{"action": "Allow", "source": {"selector": "role == 'web'"}}])
_web1 = wep("prod", "web1", "node2", "10.65.1.1", labels={"role": "web"})
_web2 = wep("prod", "web2", "node3", "10.65.1.1", labels={"role": "web"})  # same address
_g_red = gnp("g-red", "team == 'red'",
             egress=[{"action": "Deny", "destination": {"selector": "team == 'red'"}}])
_WEB = sel("role == 'web'")

PROFILES = [
    State("one local endpoint with a profile", [_open, _db1], Expect(
        endpoints={"prod/db1": ep(profiles=["open"])}, profiles={"open"})),
    State("policy with an empty IP set", [_open, _db1, _g_db], Expect(
        endpoints={"prod/db1": ep(["g-db"], profiles=["open"])},
        ipsets={_WEB: set()}, policies={"g-db"}, profiles={"open"})),
    State("remote endpoint fills the set", [_open, _db1, _g_db, _web1], Expect(
        endpoints={"prod/db1": ep(["g-db"], profiles=["open"])},
        ipsets={_WEB: {"10.65.1.1/32"}}, policies={"g-db"}, profiles={"open"})),
    State("second endpoint with the same address", [_open, _db1, _g_db, _web1, _web2], Expect(
        endpoints={"prod/db1": ep(["g-db"], profiles=["open"])},
        ipsets={_WEB: {"10.65.1.1/32"}}, policies={"g-db"}, profiles={"open"})),
    State("one contributor of the address gone", [_open, _db1, _g_db, _web2], Expect(
        endpoints={"prod/db1": ep(["g-db"], profiles=["open"])},
        ipsets={_WEB: {"10.65.1.1/32"}}, policies={"g-db"}, profiles={"open"})),
    State("profile labels are inherited", [_open_red, _db1, _g_db, _web2, _g_red], Expect(
        endpoints={"prod/db1": ep(["g-db"], ["g-red"], ["open"])},
        ipsets={_WEB: {"10.65.1.1/32"}, sel("team == 'red'"): {"10.65.0.1/32"}},
        policies={"g-db", "g-red"}, profiles={"open"})),
    State("profile stops applying labels", [_open, _db1, _g_db, _web2, _g_red], Expect(
        endpoints={"prod/db1": ep(["g-db"], profiles=["open"])},
        ipsets={_WEB: {"10.65.1.1/32"}}, policies={"g-db"}, profiles={"open"})),
]

# --- tiers, order ties, Pass ----------------------------------------------------------------

_api = wep("prod", "api", "node1", "10.65.0.10", labels={"app": "api"})
_API = "app == 'api'"
_platform_allow = gnp("platform.allow", _API, tier="platform", order=10,
                      ingress=[ALLOW], egress=[ALLOW])
_security_block = gnp("security.block", _API, tier="security", order=10, ingress=[
    {"action": "Deny", "source": {"nets": ["192.0.2.0/24"]}}, {"action": "Pass"}])
_p_b = gnp("p-b", _API, order=5, ingress=[ALLOW])
_p_a = gnp("p-a", _API, order=5, ingress=[ALLOW])
_p_none = gnp("p-none", _API, ingress=[ALLOW])
_p_egress = gnp("p-egress", _API, order=1, egress=[ALLOW])
_TIER_POLICIES = [_api, _platform_allow, _security_block, _p_a, _p_b, _p_none, _p_egress]
_ALL_TIER_POLICIES = {"platform.allow", "security.block", "p-a", "p-b", "p-none", "p-egress"}

TIERS = [
    State("tiers by order, policies by order then name", [
        *_TIER_POLICIES, tier("platform", 50), tier("security", 100, "Pass")], Expect(
        endpoints={"prod/api": ep(
            ["platform.allow", "security.block", "p-a", "p-b", "p-none"],
            ["platform.allow", "p-egress"])},
        policies=_ALL_TIER_POLICIES,
        tiers={"prod/api": [("platform", "deny"), ("security", "pass"), ("default", "deny")]})),
    State("tier order changes", [
        *_TIER_POLICIES, tier("platform", 50), tier("security", 10, "Pass")], Expect(
        endpoints={"prod/api": ep(
            ["security.block", "platform.allow", "p-a", "p-b", "p-none"],
            ["platform.allow", "p-egress"])},
        policies=_ALL_TIER_POLICIES,
        tiers={"prod/api": [("security", "pass"), ("platform", "deny"), ("default", "deny")]})),
    State("tier after the default tier; default tier passes", [
        *_TIER_POLICIES, tier("platform", 50), tier("security", 2_000_000, "Pass"),
        tier("default", default_action="Pass")], Expect(
        endpoints={"prod/api": ep(
            ["platform.allow", "p-a", "p-b", "p-none", "security.block"],
            ["platform.allow", "p-egress"])},
        policies=_ALL_TIER_POLICIES,
        tiers={"prod/api": [("platform", "deny"), ("default", "pass"), ("security", "pass")]})),
    State("tier without a Tier resource sorts last", [
        *_TIER_POLICIES, tier("platform", 3_000_000), tier("default", default_action="Pass")],
        Expect(
        endpoints={"prod/api": ep(
            ["p-a", "p-b", "p-none", "platform.allow", "security.block"],
            ["p-egress", "platform.allow"])},
        policies=_ALL_TIER_POLICIES,
        tiers={"prod/api": [("default", "pass"), ("platform", "deny"), ("security", "deny")]})),
    State("policy order and types change", [
        _api, _platform_allow, _security_block, _p_a, _p_none,
        gnp("p-b", _API, order=1, ingress=[ALLOW]),
        gnp("p-egress", _API, order=1, egress=[ALLOW], types=["Ingress", "Egress"]),
        tier("platform", 3_000_000), tier("default", default_action="Pass")], Expect(
        endpoints={"prod/api": ep(
            ["p-b", "p-egress", "p-a", "p-none", "platform.allow", "security.block"],
            ["p-egress", "platform.allow"])},
        policies=_ALL_TIER_POLICIES)),
]

# --- Kubernetes: conversion, named ports, network sets, namespace selectors --------------

_ns_prod = namespace("prod", env="prod")
_ns_dev = namespace("dev", env="dev")
_ns_dev_relabelled = namespace("dev", env="prod")
_pod_api = pod("prod", "api", "node1", "10.65.0.1", labels={"app": "api"}, ports=[("http", 8080)])
_pod_db = pod("prod", "db", "node2", "10.65.1.2", labels={"app": "db"}, ports=[("pg", 5432)])
_pod_db_moved = pod("prod", "db", "node1", "10.65.1.2", labels={"app": "db"},
                    ports=[("pg", 5432)])
_pod_dev_db = pod("dev", "db", "node2", "10.65.1.3", labels={"app": "db"})
_pod_dev_web = pod("dev", "web", "node1", "10.65.0.2", labels={"app": "web"})
_knp = k8s_np("prod", "allow-api", {"app": "api"},
              ingress=[{"from": [{"podSelector": {"matchLabels": {"app": "db"}}}],
                        "ports": [{"port": "http"}]}])
_EXTERNAL = {"kind": "external"}
_gns = global_netset("gns-ext", ["198.51.100.0/24"], _EXTERNAL)
_ns_int = netset("prod", "ns-int", ["192.0.2.0/28"], _EXTERNAL)
_ns_dev_set = netset("dev", "ns-dev", ["203.0.113.0/28"], _EXTERNAL)
_to_external = {"action": "Allow", "destination": {"selector": "kind == 'external'"}}
_g_ext = gnp("g-ext", _API, egress=[_to_external])
_np_ext = np("prod", "np-ext", _API, egress=[_to_external])
_np_global = np("prod", "np-global", _API, egress=[{"action": "Allow", "destination": {
    "selector": "kind == 'external'", "namespaceSelector": "global()"}}])
_g_prod_only = gnp("g-prod-only", "all()", namespaceSelector="env == 'prod'", ingress=[ALLOW])
_g_from_dev = gnp("g-from-dev", _API, ingress=[
    {"action": "Allow", "source": {"namespaceSelector": "env == 'dev'"}}])

_KNP = "prod/knp.default.allow-api"
_KNP_SRC = sel("projectcalico.org/namespace == 'prod' && projectcalico.org/orchestrator == 'k8s'"
               " && app == 'db'")
_HTTP = named("all()", "tcp", "http")
_EXT_ALL = sel("kind == 'external'")
_EXT_PROD = sel("projectcalico.org/namespace == 'prod' && kind == 'external'")
_EXT_GLOBAL = sel("global() && kind == 'external'")
_FROM_DEV = sel("pcns.env == 'dev'")
_PROD_PROFILES = ["kns.prod", "ksa.prod.default"]
_DEV_PROFILES = ["kns.dev", "ksa.dev.default"]
_C1 = [_ns_prod, _ns_dev, _pod_api, _pod_db, _pod_dev_db, _knp]
_C2 = [*_C1, _gns, _ns_int, _ns_dev_set, _g_ext, _np_ext, _np_global]
_C3 = [*_C2, _pod_dev_web, _g_prod_only, _g_from_dev]
_EGRESS_API = ["g-ext", "prod/np-ext", "prod/np-global"]
_EXT_SETS = {_EXT_ALL: {"198.51.100.0/24", "192.0.2.0/28", "203.0.113.0/28"},
             _EXT_PROD: {"192.0.2.0/28"}, _EXT_GLOBAL: {"198.51.100.0/24"}}

KUBERNETES = [
    State("k8s policy with pod selector and named port", _C1, Expect(
        endpoints={"prod/api": ep([_KNP], profiles=_PROD_PROFILES)},
        ipsets={_KNP_SRC: {"10.65.1.2/32"}, _HTTP: {"10.65.0.1/32,tcp:8080"}},
        policies={_KNP}, profiles=set(_PROD_PROFILES),
        routes={"10.65.0.1/32": "local_workload", "10.65.1.2/32": "remote_workload",
                "10.65.1.3/32": "remote_workload"})),
    State("global and namespaced network sets", _C2, Expect(
        endpoints={"prod/api": ep([_KNP], _EGRESS_API, _PROD_PROFILES)},
        ipsets={_KNP_SRC: {"10.65.1.2/32"}, _HTTP: {"10.65.0.1/32,tcp:8080"}, **_EXT_SETS},
        policies={_KNP, *_EGRESS_API}, profiles=set(_PROD_PROFILES))),
    State("namespace selectors on policies and rules", _C3, Expect(
        endpoints={
            "prod/api": ep([_KNP, "g-from-dev", "g-prod-only"], _EGRESS_API, _PROD_PROFILES),
            "dev/web": ep(profiles=_DEV_PROFILES)},
        ipsets={_KNP_SRC: {"10.65.1.2/32"}, _HTTP: {"10.65.0.1/32,tcp:8080"}, **_EXT_SETS,
                _FROM_DEV: {"10.65.1.3/32", "10.65.0.2/32", "203.0.113.0/28"}},
        policies={_KNP, *_EGRESS_API, "g-from-dev", "g-prod-only"},
        profiles={*_PROD_PROFILES, *_DEV_PROFILES})),
    State("namespace relabelled", [*_C3[:1], _ns_dev_relabelled, *_C3[2:]], Expect(
        endpoints={
            "prod/api": ep([_KNP, "g-from-dev", "g-prod-only"], _EGRESS_API, _PROD_PROFILES),
            "dev/web": ep(["g-prod-only"], profiles=_DEV_PROFILES)},
        ipsets={_KNP_SRC: {"10.65.1.2/32"}, _HTTP: {"10.65.0.1/32,tcp:8080"}, **_EXT_SETS,
                _FROM_DEV: set()},
        policies={_KNP, *_EGRESS_API, "g-from-dev", "g-prod-only"},
        profiles={*_PROD_PROFILES, *_DEV_PROFILES})),
    State("pod moves to this node", [
        _ns_prod, _ns_dev_relabelled, _pod_api, _pod_db_moved, *_C3[4:]], Expect(
        endpoints={
            "prod/api": ep([_KNP, "g-from-dev", "g-prod-only"], _EGRESS_API, _PROD_PROFILES),
            "prod/db": ep(["g-prod-only"], profiles=_PROD_PROFILES),
            "dev/web": ep(["g-prod-only"], profiles=_DEV_PROFILES)},
        ipsets={_KNP_SRC: {"10.65.1.2/32"}, _HTTP: {"10.65.0.1/32,tcp:8080"}, **_EXT_SETS,
                _FROM_DEV: set()},
        policies={_KNP, *_EGRESS_API, "g-from-dev", "g-prod-only"},
        profiles={*_PROD_PROFILES, *_DEV_PROFILES},
        routes={"10.65.0.1/32": "local_workload", "10.65.1.2/32": "local_workload",
                "10.65.1.3/32": "remote_workload", "10.65.0.2/32": "local_workload"})),
    State("k8s policy deleted", [
        d for d in [_ns_prod, _ns_dev_relabelled, _pod_api, _pod_db_moved, *_C3[4:]]
        if d is not _knp], Expect(
        endpoints={
            "prod/api": ep(["g-from-dev", "g-prod-only"], _EGRESS_API, _PROD_PROFILES),
            "prod/db": ep(["g-prod-only"], profiles=_PROD_PROFILES),
            "dev/web": ep(["g-prod-only"], profiles=_DEV_PROFILES)},
        ipsets={**_EXT_SETS, _FROM_DEV: set()},
        policies={*_EGRESS_API, "g-from-dev", "g-prod-only"},
        profiles={*_PROD_PROFILES, *_DEV_PROFILES})),
]

# --- endpoints moving between nodes, host endpoints, service accounts ---------------------

_g_x = gnp("g-x", "role == 'x'",
           ingress=[{"action": "Allow", "source": {"selector": "role == 'x'"}}])


def _mover(node_name: str) -> dict:
    return wep("prod", "mover", node_name, "10.65.0.7", labels={"role": "x"})


_host = hep("node1-eth0", "node1", "eth0", ["198.18.0.1"], labels={"host": "yes"})
_host_normal = gnp("host-normal", "has(host)",
                   ingress=[{"action": "Allow", "source": {"selector": "has(host)"}}])
_host_untracked = gnp("host-untracked", "has(host)", doNotTrack=True, applyOnForward=True,
                      ingress=[{"action": "Deny", "source": {"nets": ["192.0.2.0/24"]}}])
_sa_pod = wep("prod", "sa-pod", "node1", "10.65.0.8", profiles=["ksa.prod.sa1"],
              service_account="sa1")
_sa_profile = profile("ksa.prod.sa1", labels_to_apply={"pcsa.team": "blue"})
_g_sa = gnp("g-sa", "projectcalico.org/serviceaccount == 'sa1'", ingress=[
    {"action": "Allow", "source": {"serviceAccounts": {"names": ["sa1"]}}},
    {"action": "Allow", "source": {"serviceAccounts": {"selector": "team == 'blue'"}}}])
_D4 = [_mover("node3"), _g_x, _host, _host_normal, _host_untracked]

MOVES = [
    State("remote endpoint: policy inactive", [_mover("node2"), _g_x], Expect()),
    State("endpoint moves here", [_mover("node1"), _g_x], Expect(
        endpoints={"prod/mover": ep(["g-x"])},
        ipsets={sel("role == 'x'"): {"10.65.0.7/32"}}, policies={"g-x"},
        routes={"10.65.0.7/32": "local_workload"})),
    State("endpoint moves away again", [_mover("node3"), _g_x], Expect(
        routes={"10.65.0.7/32": "remote_workload"})),
    State("host endpoint: normal and untracked policy", _D4, Expect(
        host_endpoints={"node1-eth0": ep(["host-normal"])},
        ipsets={sel("has(host)"): {"198.18.0.1/32"}},
        policies={"host-normal", "host-untracked"})),
    State("service account names and selectors", [*_D4, _sa_pod, _sa_profile, _g_sa], Expect(
        endpoints={"prod/sa-pod": ep(["g-sa"], profiles=["ksa.prod.sa1"])},
        host_endpoints={"node1-eth0": ep(["host-normal"])},
        ipsets={sel("has(host)"): {"198.18.0.1/32"},
                sel("projectcalico.org/serviceaccount == 'sa1'"): {"10.65.0.8/32"},
                sel("pcsa.team == 'blue'"): {"10.65.0.8/32"}},
        policies={"host-normal", "host-untracked", "g-sa"}, profiles={"ksa.prod.sa1"})),
]

# --- missing profiles, notSelector, IP sets shared by a policy and a profile --------------

_lonely = wep("prod", "lonely", "node1", "10.65.0.9", profiles=["missing"])
_bad = wep("prod", "bad", "node2", "10.65.1.9", labels={"role": "bad"})
_g_pass = gnp("g-pass", "all()", ingress=[
    {"action": "Pass", "source": {"notSelector": "role == 'bad'"}}])
_missing = profile("missing", ingress=[
    {"action": "Allow", "source": {"selector": "role == 'bad'"}}])
_BAD = sel("role == 'bad'")

SHARING = [
    State("endpoint lists a profile that does not exist", [_lonely], Expect(
        endpoints={"prod/lonely": ep(profiles=["missing"])}, profiles={"missing"})),
    State("notSelector set and a Pass rule", [_lonely, _bad, _g_pass], Expect(
        endpoints={"prod/lonely": ep(["g-pass"], profiles=["missing"])},
        ipsets={_BAD: {"10.65.1.9/32"}}, policies={"g-pass"}, profiles={"missing"})),
    State("profile appears and shares the set", [_lonely, _bad, _g_pass, _missing], Expect(
        endpoints={"prod/lonely": ep(["g-pass"], profiles=["missing"])},
        ipsets={_BAD: {"10.65.1.9/32"}}, policies={"g-pass"}, profiles={"missing"})),
    State("policy gone, profile still uses the set", [_lonely, _bad, _missing], Expect(
        endpoints={"prod/lonely": ep(profiles=["missing"])},
        ipsets={_BAD: {"10.65.1.9/32"}}, profiles={"missing"})),
]

# --- routes: blocks, pools, host IPs ------------------------------------------------------

_pool = ip_pool("pool1", "10.65.0.0/16", vxlanMode="Always", natOutgoing=True)
_remote_pod = wep("prod", "far", "node2", "10.65.1.20")
ROUTES = [
    State("remote workload without a block", [_pool, _remote_pod, node("node2", "198.18.0.2")],
          Expect(routes={"10.65.1.20/32": "remote_workload", "198.18.0.2/32": "remote_host"})),
    State("block covers the remote workload", [
        _pool, _remote_pod, node("node2", "198.18.0.2"), node("node1", "198.18.0.1"),
        block("b2", "node2", "10.65.1.0/26"), block("b1", "node1", "10.65.0.0/26")], Expect(
        routes={"10.65.1.0/26": "remote_workload", "198.18.0.2/32": "remote_host",
                "198.18.0.1/32": "local_host"})),
]

# --- VXLAN tunnel endpoints ----------------------------------------------------------------

_vx_pool = ip_pool("vx", "10.65.0.0/16", vxlanMode="Always")
_n1 = node("node1", "198.18.0.1", vxlan_addr="10.65.255.1")
_n2 = node("node2", "198.18.0.2", vxlan_addr="10.65.255.2")
VXLAN = [
    State("VTEPs of every node with a host IP while a VXLAN pool exists",
          [_vx_pool, _n1, _n2, wep("prod", "far", "node2", "10.65.1.20")], Expect(
              routes={"10.65.1.20/32": "remote_workload"},
              vteps={"node1": ("10.65.255.1", "198.18.0.1"),
                     "node2": ("10.65.255.2", "198.18.0.2")})),
    State("no VXLAN pool: no VTEPs", [ip_pool("vx", "10.65.0.0/16"), _n1, _n2],
          Expect(vteps={})),
    State("CrossSubnet counts; a node's new host IP moves its VTEP's parent",
          [ip_pool("vx", "10.65.0.0/16", vxlanMode="CrossSubnet"), _n1,
           node("node2", "198.18.0.22", vxlan_addr="10.65.255.2")], Expect(
              vteps={"node1": ("10.65.255.1", "198.18.0.1"),
                     "node2": ("10.65.255.2", "198.18.0.22")})),
    State("disabled pool: none", [ip_pool("vx", "10.65.0.0/16", vxlanMode="Always",
                                          disabled=True), _n1, _n2], Expect(vteps={})),
]

SEQUENCES = {
    "vxlan": VXLAN,
    "profiles": PROFILES,
    "tiers": TIERS,
    "kubernetes": KUBERNETES,
    "moves": MOVES,
    "sharing": SHARING,
    "routes": ROUTES,
}
