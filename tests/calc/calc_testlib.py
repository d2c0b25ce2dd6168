"""Test helpers for the calc graph: resource builders, expected states, and a replayer.

- Builders (`wep`, `gnp`, `np`, `pod`, ...) return raw documents as a syncer would emit them,
  so the tests go through the real validator and Kubernetes conversion.
- `Expect` is what the dataplane should hold after a state: endpoints (in the `pyfelix calc`
  summary shape), IP sets (id -> members), active policy and profile ids, optionally tiers
  and routes. `sel()` / `named()` compute the IP-set id of a selector written in the test
  (ids are hashes of canonical selector text, so any spelling with the same meaning works).
- `Replayer` drives a `CalcPipeline` into a strict `ExpectedDataplane` (the recording fake that
  raises on any ordering violation), moving from datastore state to datastore state by
  sending only the differences, and reports what the dataplane holds.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import Any

from pyfelix.agent.calc import CalcPipeline, ExpectedDataplane
from pyfelix.agent.calc.rule_scanner import named_port_ip_set, selector_ip_set
from pyfelix.agent.syncer.api import RawUpdate, ResourceKey, SyncStatus, key_of

HOST = "node1"
CALICO = "projectcalico.org/v3"
PROTOCOLS = {"tcp": 6, "udp": 17, "sctp": 132}

Doc = dict[str, Any]


# --- builders ---------------------------------------------------------------------------


def _meta(name: str, namespace: str = "", labels: dict[str, str] | None = None) -> Doc:
    meta: Doc = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = dict(labels)
    return meta


def wep(namespace: str, pod: str, node: str, ip: str, *, labels: dict[str, str] | None = None,
        profiles: list[str] | None = None, ports: list[tuple[str, int]] | None = None,
        service_account: str = "") -> Doc:
    """A Calico WorkloadEndpoint; its resource name does not depend on the node (it can move)."""
    spec: Doc = {"node": node, "orchestrator": "k8s", "pod": pod, "endpoint": "eth0",
                 "interfaceName": f"cali{zlib.crc32(pod.encode()) % 10**8:08d}",
                 "ipNetworks": [f"{ip}/32"], "profiles": list(profiles or [])}
    if ports:
        spec["ports"] = [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports]
    if service_account:
        spec["serviceAccountName"] = service_account
    return {"apiVersion": CALICO, "kind": "WorkloadEndpoint",
            "metadata": _meta(f"wep-{pod}", namespace, labels), "spec": spec}


def hep(name: str, node: str, iface: str, ips: list[str], *,
        labels: dict[str, str] | None = None) -> Doc:
    return {"apiVersion": CALICO, "kind": "HostEndpoint", "metadata": _meta(name, labels=labels),
            "spec": {"node": node, "interfaceName": iface, "expectedIPs": ips}}


def _policy_spec(selector: str, ingress: list[Doc] | None, egress: list[Doc] | None,
                 order: float | None, tier: str | None, types: list[str] | None,
                 extra: Doc) -> Doc:
    spec: Doc = {"selector": selector}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    if order is not None:
        spec["order"] = order
    if tier is not None:
        spec["tier"] = tier
    if types is not None:
        spec["types"] = types
    spec.update(extra)
    return spec


def gnp(name: str, selector: str, *, ingress: list[Doc] | None = None,
        egress: list[Doc] | None = None, order: float | None = None, tier: str | None = None,
        types: list[str] | None = None, **extra: Any) -> Doc:
    return {"apiVersion": CALICO, "kind": "GlobalNetworkPolicy", "metadata": _meta(name),
            "spec": _policy_spec(selector, ingress, egress, order, tier, types, extra)}


def np(namespace: str, name: str, selector: str, *, ingress: list[Doc] | None = None,
       egress: list[Doc] | None = None, order: float | None = None, tier: str | None = None,
       types: list[str] | None = None, **extra: Any) -> Doc:
    return {"apiVersion": CALICO, "kind": "NetworkPolicy", "metadata": _meta(name, namespace),
            "spec": _policy_spec(selector, ingress, egress, order, tier, types, extra)}


def tier(name: str, order: float | None = None, default_action: str | None = None) -> Doc:
    spec: Doc = {}
    if order is not None:
        spec["order"] = order
    if default_action is not None:
        spec["defaultAction"] = default_action
    return {"apiVersion": CALICO, "kind": "Tier", "metadata": _meta(name), "spec": spec}


def profile(name: str, *, labels_to_apply: dict[str, str] | None = None,
            ingress: list[Doc] | None = None, egress: list[Doc] | None = None) -> Doc:
    spec: Doc = {}
    if labels_to_apply:
        spec["labelsToApply"] = dict(labels_to_apply)
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return {"apiVersion": CALICO, "kind": "Profile", "metadata": _meta(name), "spec": spec}


def global_netset(name: str, nets: list[str], labels: dict[str, str]) -> Doc:
    return {"apiVersion": CALICO, "kind": "GlobalNetworkSet",
            "metadata": _meta(name, labels=labels), "spec": {"nets": nets}}


def netset(namespace: str, name: str, nets: list[str], labels: dict[str, str]) -> Doc:
    return {"apiVersion": CALICO, "kind": "NetworkSet",
            "metadata": _meta(name, namespace, labels), "spec": {"nets": nets}}


def namespace(name: str, **labels: str) -> Doc:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(name, labels=labels)}


def pod(ns: str, name: str, node: str, ip: str, *, labels: dict[str, str] | None = None,
        ports: list[tuple[str, int]] | None = None) -> Doc:
    container: Doc = {"name": "main", "image": "example"}
    if ports:
        container["ports"] = [{"name": n, "containerPort": p} for n, p in ports]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(name, ns, labels),
            "spec": {"nodeName": node, "containers": [container]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


def k8s_np(ns: str, name: str, pod_selector: dict[str, str], *,
           ingress: list[Doc] | None = None, egress: list[Doc] | None = None) -> Doc:
    spec: Doc = {"podSelector": {"matchLabels": dict(pod_selector)}}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(name, ns), "spec": spec}


def node(name: str, ip: str, *, vxlan_addr: str = "") -> Doc:
    spec: Doc = {"bgp": {"ipv4Address": f"{ip}/24"}}
    if vxlan_addr:
        spec["ipv4VXLANTunnelAddr"] = vxlan_addr
    return {"apiVersion": CALICO, "kind": "Node", "metadata": _meta(name), "spec": spec}


def ip_pool(name: str, cidr: str, **spec: Any) -> Doc:
    return {"apiVersion": CALICO, "kind": "IPPool", "metadata": _meta(name),
            "spec": {"cidr": cidr, **spec}}


def block(name: str, node_name: str, cidr: str) -> Doc:
    return {"apiVersion": CALICO, "kind": "BlockAffinity", "metadata": _meta(name),
            "spec": {"node": node_name, "cidr": cidr, "state": "confirmed"}}


def felix_config(name: str, **settings: Any) -> Doc:
    return {"apiVersion": CALICO, "kind": "FelixConfiguration", "metadata": _meta(name),
            "spec": dict(settings)}


ALLOW: Doc = {"action": "Allow"}


# --- expectations -----------------------------------------------------------------------


def sel(text: str) -> str:
    """The IP-set id for endpoints matching `text`."""
    return selector_ip_set(text).id


def named(text: str, protocol: str, port_name: str) -> str:
    """The IP-set id for `port_name`/`protocol` on endpoints matching `text`."""
    return named_port_ip_set(text, PROTOCOLS[protocol], port_name).id


def ep(ingress: list[str] | None = None, egress: list[str] | None = None,
       profiles: list[str] | None = None) -> dict[str, list[str]]:
    return {"ingress": list(ingress or []), "egress": list(egress or []),
            "profiles": list(profiles or [])}


@dataclass
class Expect:
    endpoints: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    ipsets: dict[str, set[str]] = field(default_factory=dict)
    policies: set[str] = field(default_factory=set)
    profiles: set[str] = field(default_factory=set)
    host_endpoints: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # optional: endpoint label -> [(tier, default action)]; route dst -> type;
    # node -> (VTEP address, parent device IP)
    tiers: dict[str, list[tuple[str, str]]] | None = None
    routes: dict[str, str] | None = None
    vteps: dict[str, tuple[str, str]] | None = None


@dataclass
class State:
    name: str
    docs: list[Doc]
    expect: Expect


EMPTY = State("empty", [], Expect())


def observe(dp: ExpectedDataplane, expect: Expect) -> dict[str, Any]:
    """What the dataplane holds, in the shape of `expect` (optional parts only if asked)."""
    summary = dp.summary()
    seen: dict[str, Any] = {
        "endpoints": summary["endpoints"],
        "host_endpoints": summary.get("host_endpoints", {}),
        "ipsets": {i: set(m) for i, m in dp.ip_sets.items()},
        "policies": {p.name for p in dp.policies},
        "profiles": set(dp.profiles),
    }
    if expect.tiers is not None:
        seen["tiers"] = {
            label: [(t.name, t.default_action) for t in endpoint.tiers]
            for endpoint_id, endpoint in dp.workload_endpoints.items()
            for label in [summary_label(endpoint_id)] if label in expect.tiers}
    if expect.routes is not None:
        seen["routes"] = {dst: r.type for dst, r in dp.routes.items()
                          if dst in expect.routes or r.type.endswith("workload")}
    if expect.vteps is not None:
        seen["vteps"] = {n: (v.ipv4_addr, v.parent_device_ip) for n, v in dp.vteps.items()}
    return seen


def summary_label(endpoint_id: Any) -> str:
    from pyfelix.agent.calc.expected_dataplane import endpoint_label

    return endpoint_label(endpoint_id)


def expected(expect: Expect) -> dict[str, Any]:
    out: dict[str, Any] = {
        "endpoints": expect.endpoints,
        "host_endpoints": expect.host_endpoints,
        "ipsets": expect.ipsets,
        "policies": expect.policies,
        "profiles": expect.profiles,
    }
    if expect.tiers is not None:
        out["tiers"] = expect.tiers
    if expect.routes is not None:
        out["routes"] = expect.routes
    if expect.vteps is not None:
        out["vteps"] = expect.vteps
    return out


# --- replay -----------------------------------------------------------------------------


def _keyed(docs: list[Doc]) -> dict[ResourceKey, Doc]:
    out = {}
    for doc in docs:
        key = key_of(doc)
        assert key not in out, f"state defines {key} twice"
        out[key] = doc
    return out


class Replayer:
    """Moves a pipeline from datastore state to datastore state, sending differences only."""

    def __init__(self, hostname: str = HOST, *, order: str = "sorted", seed: int = 0,
                 naive: bool = False) -> None:
        self.dataplane = ExpectedDataplane(strict=True)
        self.pipeline = CalcPipeline(hostname, self.dataplane, naive_ipsets=naive)
        self.current: dict[ResourceKey, Doc] = {}
        self.order = order
        self.random = random.Random(seed)
        self.started = False

    def queue(self, docs: list[Doc]) -> None:
        """Queue the updates from the current state to `docs` (not processed yet)."""
        wanted = _keyed(docs)
        updates = [RawUpdate(k, None, "test") for k in self.current if k not in wanted]
        updates += [RawUpdate(k, d, "test") for k, d in wanted.items()
                    if self.current.get(k) != d]
        updates.sort(key=lambda u: u.key)
        if self.order == "reversed":
            updates.reverse()
        elif self.order == "shuffled":
            self.random.shuffle(updates)
        # one update per batch in shuffled mode: the pipeline's batching must not matter
        if self.order == "shuffled":
            for update in updates:
                self.pipeline.on_updates([update])
        else:
            self.pipeline.on_updates(updates)
        self.current = wanted

    def process(self) -> None:
        if not self.started:
            self.pipeline.on_status(SyncStatus.IN_SYNC)
            self.started = True
        self.pipeline.process_pending()
        assert self.dataplane.in_sync

    def go_to(self, docs: list[Doc]) -> None:
        self.queue(docs)
        self.process()

    def check(self, state: State) -> None:
        assert not self.pipeline.validator.errors, self.pipeline.validator.errors
        assert observe(self.dataplane, state.expect) == expected(state.expect), state.name
