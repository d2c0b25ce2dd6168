"""The lab's Service support without a kernel: EndpointSlices as Kubernetes' controller makes
them, the node's frontends, and kube-proxy's iptables layout."""

from __future__ import annotations

from typing import Any

from pyfelix.agent import proto
from pyfelix.lab.services import frontends_for, generated_slices, kube_proxy_restore


def pod(name: str, ip: str, labels: dict[str, str], ports: list[dict[str, Any]] | None = None,
        phase: str = "Running", node: str = "node1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "shop", "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "main", "ports": ports or []}]},
            "status": {"phase": phase, "podIP": ip}}


def service(name: str, ip: str, selector: dict[str, str] | None, ports: list[dict[str, Any]]
            ) -> dict[str, Any]:
    spec: dict[str, Any] = {"clusterIP": ip, "ports": ports}
    if selector is not None:
        spec["selector"] = selector
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name,
                                                               "namespace": "shop"},
            "spec": spec}


def test_slices_follow_selectors_named_ports_and_given_slices() -> None:
    docs = [
        pod("a", "10.65.0.1", {"app": "web"}, [{"name": "http", "containerPort": 8080}]),
        pod("b", "10.65.0.2", {"app": "web"}, [{"name": "http", "containerPort": 9090}]),
        pod("c", "10.65.0.3", {"app": "web"}, phase="Pending"),
        pod("d", "10.65.0.4", {"app": "db"}),
        service("web", "10.96.0.10", {"app": "web"},
                [{"name": "http", "port": 80, "targetPort": "http"}]),
        service("none", "10.96.0.11", {"app": "nothing"}, [{"port": 80}]),
        service("manual", "10.96.0.12", None, [{"port": 80}]),
    ]
    slices = {s["metadata"]["name"]: s for s in generated_slices(docs)}
    assert sorted(slices) == ["none-pyfelix-lab", "web-pyfelix-lab", "web-pyfelix-lab-1"]
    ports = {n: [(e["addresses"][0], s["ports"][0]["port"]) for e in s["endpoints"]]
             for n, s in slices.items() if s["endpoints"]}
    assert ports == {"web-pyfelix-lab": [("10.65.0.1", 8080)],
                     "web-pyfelix-lab-1": [("10.65.0.2", 9090)]}
    assert slices["none-pyfelix-lab"]["endpoints"] == []
    # a Service with its own slice gets none generated
    given = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "mine", "namespace": "shop",
                          "labels": {"kubernetes.io/service-name": "web"}},
             "addressType": "IPv4", "endpoints": []}
    assert "web-pyfelix-lab" not in {s["metadata"]["name"]
                                     for s in generated_slices([*docs, given])}
    # the node's frontends come from the same documents through the agent's ServiceIndex
    fronts = {f.id: f for f in frontends_for([*docs, *slices.values()], "node1")}
    assert [(b.addr, b.port) for b in fronts["10.96.0.10:80/6"].backends] == [
        ("10.65.0.1", 8080), ("10.65.0.2", 9090)]
    assert fronts["10.96.0.11:80/6"].backends == ()


def test_kube_proxy_layout() -> None:
    web = proto.ServiceFrontendUpdate(
        id="10.96.0.10:80/6", service="shop/web", port_name="http", vip="10.96.0.10", port=80,
        protocol=6, backends=(proto.ServiceBackend("10.65.0.1", 8080),
                              proto.ServiceBackend("10.65.0.2", 8080)), affinity_timeout=30)
    empty = proto.ServiceFrontendUpdate(
        id="10.96.0.11:53/17", service="shop/empty", port_name="", vip="10.96.0.11", port=53,
        protocol=17)
    text = kube_proxy_restore([web, empty], existing_chains=["KUBE-SVC-OLD"])
    lines = text.splitlines()
    nat = lines[:lines.index("COMMIT")]
    svc = [line for line in nat if line.startswith("-A KUBE-SERVICES")]
    assert len(svc) == 1 and "-d 10.96.0.10/32 -p tcp" in svc[0] and "--dport 80" in svc[0]
    chain = svc[0].split()[-1]
    picks = [line for line in nat if line.startswith(f"-A {chain}") and "recent" not in line]
    assert "--probability 0.50000000000" in picks[0] and "statistic" not in picks[1]
    assert sum("--rcheck --seconds 30" in line for line in nat) == 2
    assert sum("DNAT --to-destination 10.65.0." in line for line in nat) == 2
    assert "-X KUBE-SVC-OLD" in nat
    filt = lines[lines.index("*filter"):]
    assert any("-d 10.96.0.11/32 -p udp" in line and "REJECT --reject-with "
               "icmp-port-unreachable" in line for line in filt)


def test_kube_proxy_node_ports() -> None:
    backends = (proto.ServiceBackend("10.65.0.1", 8080, "node1"),)
    cluster = proto.ServiceFrontendUpdate(
        id="0.0.0.0:30080/6", service="shop/web", port_name="", vip="0.0.0.0", port=30080,
        protocol=6, kind="nodeport", backends=backends)
    local = proto.ServiceFrontendUpdate(
        id="0.0.0.0:30081/6", service="shop/local", port_name="", vip="0.0.0.0", port=30081,
        protocol=6, kind="nodeport", backends=backends, traffic_local=True)
    none = proto.ServiceFrontendUpdate(
        id="0.0.0.0:30082/17", service="shop/gone", port_name="", vip="0.0.0.0", port=30082,
        protocol=17, kind="nodeport", traffic_local=True)
    lines = kube_proxy_restore([cluster, local, none]).splitlines()
    nat = lines[:lines.index("COMMIT")]
    # NodePorts last in KUBE-SERVICES, for local destinations only
    assert [x for x in nat if x.startswith("-A KUBE-SERVICES")] == [
        "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"]
    jumps = {x.split("--dport ")[1].split()[0]: x.split()[-1]
             for x in nat if x.startswith("-A KUBE-NODEPORTS")}
    assert sorted(jumps) == ["30080", "30081"]
    ext = {port: [x for x in nat if x.startswith(f"-A {chain} ")] for port, chain in jumps.items()}
    assert ext["30080"][0].endswith("-j KUBE-MARK-MASQ")  # Cluster: masqueraded
    assert not any("KUBE-MARK-MASQ" in x for x in ext["30081"])  # Local: client kept
    assert all(rules[-1].split()[-1].startswith("KUBE-SVC-") for rules in ext.values())
    filt = lines[lines.index("*filter"):]
    assert any(x.startswith("-A KUBE-EXTERNAL-SERVICES -m addrtype --dst-type LOCAL -p udp")
               and "--dport 30082" in x and "REJECT" in x for x in filt)
    assert not any("0.0.0.0" in x for x in lines)


def test_dual_stack_slices_and_ip6tables_rules() -> None:
    """A Service with both families gets an IPv6 slice of the pods' IPv6 addresses; the
    IPv6 frontends render for ip6tables (/128, [addr]:port, icmp6-port-unreachable) and
    stay out of the IPv4 rules (and the reverse)."""
    a = pod("a", "10.65.0.1", {"app": "web"}, [{"name": "http", "containerPort": 8080}])
    a["status"]["podIPs"] = [{"ip": "10.65.0.1"}, {"ip": "fd00:65::1"}]
    web = service("web", "10.96.0.10", {"app": "web"},
                  [{"name": "http", "port": 80, "targetPort": "http"}])
    web["spec"].update(clusterIPs=["10.96.0.10", "fd00:96::10"], ipFamilies=["IPv4", "IPv6"])
    slices = {s["metadata"]["name"]: s for s in generated_slices([a, web])}
    assert sorted(slices) == ["web-pyfelix-lab", "web-pyfelix-lab-v6"]
    assert slices["web-pyfelix-lab-v6"]["addressType"] == "IPv6"
    assert slices["web-pyfelix-lab-v6"]["endpoints"][0]["addresses"] == ["fd00:65::1"]
    fronts = frontends_for([a, web, *slices.values()], "node1")
    assert sorted(f.id for f in fronts) == ["10.96.0.10:80/6", "fd00:96::10:80/6"]
    v6 = kube_proxy_restore(fronts, family=6)
    assert "-d fd00:96::10/128 -p tcp" in v6 and "--to-destination [fd00:65::1]:8080" in v6
    assert "10.96.0.10" not in v6 and "10.65.0.1" not in v6
    v4 = kube_proxy_restore(fronts)
    assert "fd00:" not in v4 and "--to-destination 10.65.0.1:8080" in v4
    empty = proto.ServiceFrontendUpdate(
        id="fd00:96::11:80/6", service="shop/empty", port_name="", vip="fd00:96::11",
        port=80, protocol=6)
    assert "REJECT --reject-with icmp6-port-unreachable" in kube_proxy_restore([empty],
                                                                               family=6)


def test_dual_stack_node_ports_render_for_both_families() -> None:
    """A dual-stack NodePort Service: the IPv4 NodePort frontend (0.0.0.0) in the iptables
    rules, the IPv6 one ([::], the IPv6 endpoints) in the ip6tables rules, each with
    kube-proxy's KUBE-NODEPORTS / KUBE-EXT layout; a node port without endpoints REJECTs
    with icmp6-port-unreachable."""
    a = pod("a", "10.65.0.1", {"app": "web"}, [{"name": "http", "containerPort": 8080}])
    a["status"]["podIPs"] = [{"ip": "10.65.0.1"}, {"ip": "fd00:65::1"}]
    web = service("web", "10.96.0.10", {"app": "web"},
                  [{"name": "http", "port": 80, "targetPort": "http", "nodePort": 30080}])
    web["spec"].update(type="NodePort", clusterIPs=["10.96.0.10", "fd00:96::10"],
                       ipFamilies=["IPv4", "IPv6"])
    slices = generated_slices([a, web])
    fronts = frontends_for([a, web, *slices], "node1")
    assert sorted(f.id for f in fronts) == sorted(["0.0.0.0:30080/6", ":::30080/6",
                                                   "10.96.0.10:80/6", "fd00:96::10:80/6"])
    v6 = kube_proxy_restore(fronts, family=6).splitlines()
    v4 = kube_proxy_restore(fronts).splitlines()
    for lines, backend in ((v6, "[fd00:65::1]:8080"), (v4, "10.65.0.1:8080")):
        nat = lines[:lines.index("COMMIT")]
        assert "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS" in nat
        node_port = [x for x in nat if x.startswith("-A KUBE-NODEPORTS")]
        assert len(node_port) == 1 and "--dport 30080" in node_port[0]
        ext = node_port[0].split()[-1]
        first = next(x for x in nat if x.startswith(f"-A {ext} "))
        assert first.endswith("-j KUBE-MARK-MASQ")
        assert sum(f"--to-destination {backend}" in x for x in nat) == 2  # ClusterIP, NodePort
    assert not any("10.65.0.1" in x or "0.0.0.0" in x for x in v6)
    assert not any("fd00:" in x for x in v4)
    none = proto.ServiceFrontendUpdate(
        id=":::30082/17", service="shop/gone", port_name="", vip="::", port=30082,
        protocol=17, kind="nodeport", traffic_local=True)
    filt = kube_proxy_restore([none], family=6).splitlines()
    assert any(x.startswith("-A KUBE-EXTERNAL-SERVICES -m addrtype --dst-type LOCAL -p udp")
               and "--dport 30082" in x and "icmp6-port-unreachable" in x for x in filt)
    assert "--dport 30082" not in kube_proxy_restore([none])
