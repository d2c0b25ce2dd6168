"""ServiceIndex through the whole pipeline (validator, calc graph, sequencer) into a strict
ExpectedDataplane: frontends per VIP/port/protocol, ready backends only (terminating ones as
the fallback), traffic policy Local, rejects for Services without endpoints, and a change
that touches only its own frontends."""

from __future__ import annotations

from typing import Any

from pyfelix.agent import proto
from pyfelix.agent.calc import CalcPipeline, ExpectedDataplane
from pyfelix.agent.syncer.api import RawUpdate, SyncStatus, key_of

B = proto.ServiceBackend


def svc(name: str, ip: str, ports: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"clusterIP": ip, "selector": {"app": name}, "ports": ports, **spec}}


def eps(name: str, service: str, endpoints: list[tuple[str, str, str]],
        ports: list[dict[str, Any]]) -> dict[str, Any]:
    """endpoints: (address, node, state) with state ready | terminating | notready."""
    items = [{"addresses": [a], "nodeName": n,
              "conditions": {"ready": s == "ready", "serving": s != "notready",
                             "terminating": s == "terminating"}} for a, n, s in endpoints]
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "endpoints": items, "ports": ports}


HTTP = [{"name": "http", "port": 80, "targetPort": 8080},
        {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]
SLICE_PORTS = [{"name": "http", "port": 8080, "protocol": "TCP"},
               {"name": "dns", "port": 5353, "protocol": "UDP"}]


class Harness:
    def __init__(self) -> None:
        self.dataplane = ExpectedDataplane()
        self.pipeline = CalcPipeline("node1", self.dataplane)
        self.pipeline.feed([], SyncStatus.IN_SYNC)

    def put(self, *docs: dict[str, Any]) -> list[Any]:
        before = len(self.dataplane.messages)
        self.pipeline.feed([RawUpdate(key_of(d), d, "test") for d in docs])
        return self.dataplane.messages[before:]

    def delete(self, doc: dict[str, Any]) -> list[Any]:
        before = len(self.dataplane.messages)
        self.pipeline.feed([RawUpdate(key_of(doc), None, "test")])
        return self.dataplane.messages[before:]

    def backends(self) -> dict[str, tuple[B, ...]]:
        return {i: f.backends for i, f in sorted(self.dataplane.service_frontends.items())}


def test_frontends_ready_backends_and_terminating_fallback() -> None:
    h = Harness()
    h.put(svc("web", "10.96.0.10", HTTP, sessionAffinity="ClientIP"),
          eps("web-a", "web", [("10.65.0.1", "node1", "ready"),
                               ("10.65.0.2", "node2", "terminating"),
                               ("10.65.0.3", "node2", "notready")], SLICE_PORTS),
          eps("web-b", "web", [("10.65.0.4", "node2", "ready"),
                               ("10.65.0.1", "node1", "ready")], SLICE_PORTS))
    assert h.backends() == {
        "10.96.0.10:53/17": (B("10.65.0.1", 5353, "node1"), B("10.65.0.4", 5353, "node2")),
        "10.96.0.10:80/6": (B("10.65.0.1", 8080, "node1"), B("10.65.0.4", 8080, "node2")),
    }
    http = h.dataplane.service_frontends["10.96.0.10:80/6"]
    assert (http.service, http.port_name, http.kind, http.affinity_timeout) == (
        "shop/web", "http", "cluster", 10800)
    # only terminating endpoints left: they serve (kube-proxy's fallback)
    h.put(eps("web-b", "web", [], SLICE_PORTS),
          eps("web-a", "web", [("10.65.0.2", "node2", "terminating")], SLICE_PORTS))
    assert h.backends()["10.96.0.10:80/6"] == (B("10.65.0.2", 8080, "node2"),)


def test_no_endpoints_is_a_frontend_without_backends_then_removed_with_the_service() -> None:
    h = Harness()
    sent = h.put(svc("empty", "10.96.0.11", [{"port": 80}]))
    assert [type(m) for m in sent] == [proto.ServiceFrontendUpdate]
    assert h.backends() == {"10.96.0.11:80/6": ()}
    sent = h.delete(svc("empty", "10.96.0.11", [{"port": 80}]))
    assert sent == [proto.ServiceFrontendRemove(id="10.96.0.11:80/6")]
    # headless and ExternalName services have no frontend
    assert h.put(svc("headless", "None", [{"port": 80}]),
                 svc("ext", "", [{"port": 80}], type="ExternalName")) == []


def test_a_change_touches_only_its_own_frontends_and_repeats_send_nothing() -> None:
    h = Harness()
    h.put(svc("web", "10.96.0.10", HTTP), svc("db", "10.96.0.12", [{"port": 5432}]),
          eps("db-a", "db", [("10.65.0.9", "node2", "ready")],
              [{"name": "", "port": 5432, "protocol": "TCP"}]))
    sent = h.put(eps("web-a", "web", [("10.65.0.1", "node1", "ready")], SLICE_PORTS))
    assert sorted(m.id for m in sent) == ["10.96.0.10:53/17", "10.96.0.10:80/6"]
    assert h.put(eps("web-a", "web", [("10.65.0.1", "node1", "ready")], SLICE_PORTS)) == []
    assert h.backends()["10.96.0.12:5432/6"] == (B("10.65.0.9", 5432, "node2"),)


def test_traffic_policy_local_and_external_ips() -> None:
    h = Harness()
    h.put(svc("web", "10.96.0.10", [{"name": "http", "port": 80, "targetPort": 8080}],
              internalTrafficPolicy="Local", externalIPs=["192.0.2.10"]),
          eps("web-a", "web", [("10.65.0.1", "node1", "ready"), ("10.65.0.4", "node2", "ready")],
              SLICE_PORTS))
    assert h.backends() == {
        "10.96.0.10:80/6": (B("10.65.0.1", 8080, "node1"),),
        "192.0.2.10:80/6": (B("10.65.0.1", 8080, "node1"), B("10.65.0.4", 8080, "node2")),
    }
    assert h.dataplane.service_frontends["192.0.2.10:80/6"].kind == "external"
    h.put(svc("web", "10.96.0.10", [{"name": "http", "port": 80, "targetPort": 8080}],
              externalTrafficPolicy="Local", externalIPs=["192.0.2.10"]))
    assert h.backends()["192.0.2.10:80/6"] == (B("10.65.0.1", 8080, "node1"),)
    assert len(h.backends()["10.96.0.10:80/6"]) == 2


def test_node_ports_follow_the_external_traffic_policy() -> None:
    h = Harness()
    ports = [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]
    h.put(svc("web", "10.96.0.10", ports, type="NodePort"),
          eps("web-a", "web", [("10.65.0.1", "node1", "ready"), ("10.65.0.4", "node2", "ready")],
              SLICE_PORTS))
    both = (B("10.65.0.1", 8080, "node1"), B("10.65.0.4", 8080, "node2"))
    assert h.backends() == {"0.0.0.0:30080/6": both, "10.96.0.10:80/6": both}
    node_port = h.dataplane.service_frontends["0.0.0.0:30080/6"]
    assert (node_port.kind, node_port.vip, node_port.port, node_port.traffic_local) == (
        "nodeport", proto.NODEPORT_VIP, 30080, False)
    # Local: this node's endpoints only; none here -> no backends (rejected)
    h.put(svc("web", "10.96.0.10", ports, type="NodePort", externalTrafficPolicy="Local"))
    assert h.backends()["0.0.0.0:30080/6"] == (B("10.65.0.1", 8080, "node1"),)
    assert h.dataplane.service_frontends["0.0.0.0:30080/6"].traffic_local
    h.put(eps("web-a", "web", [("10.65.0.4", "node2", "ready")], SLICE_PORTS))
    assert h.backends()["0.0.0.0:30080/6"] == ()
    assert h.backends()["10.96.0.10:80/6"] == (B("10.65.0.4", 8080, "node2"),)
    # back to ClusterIP: the node port goes
    sent = h.put(svc("web", "10.96.0.10", [{"name": "http", "port": 80, "targetPort": 8080}]))
    assert proto.ServiceFrontendRemove(id="0.0.0.0:30080/6") in sent


def test_an_invalid_slice_drops_only_its_own_backends() -> None:
    h = Harness()
    h.put(svc("web", "10.96.0.10", HTTP),
          eps("web-a", "web", [("10.65.0.1", "node1", "ready")], SLICE_PORTS),
          eps("web-b", "web", [("10.65.0.4", "node2", "ready")], SLICE_PORTS))
    bad = eps("web-b", "web", [("10.65.0.4", "node2", "ready")], SLICE_PORTS)
    bad["endpoints"][0]["addresses"] = ["not-an-ip"]
    h.put(bad)
    assert h.backends()["10.96.0.10:80/6"] == (B("10.65.0.1", 8080, "node1"),)
    assert "endpoints[0].addresses[0]" in h.pipeline.validator.errors[key_of(bad)]


def test_ipv6_cluster_ips_get_the_endpoints_of_ipv6_slices() -> None:
    """A dual-stack Service: its IPv4 VIP gets the IPv4 slice's endpoints, its IPv6 VIP the
    IPv6 slice's (never mixed); an IPv6-only Service is no longer dropped."""
    h = Harness()
    six = eps("web-v6", "web", [("fd00:65::1", "node1", "ready")], SLICE_PORTS)
    six["addressType"] = "IPv6"
    h.put(svc("web", "10.96.0.10", HTTP, clusterIPs=["10.96.0.10", "fd00:96::10"],
              ipFamilies=["IPv4", "IPv6"], ipFamilyPolicy="RequireDualStack"),
          eps("web-v4", "web", [("10.65.0.1", "node1", "ready")], SLICE_PORTS), six)
    got = h.backends()
    assert got["10.96.0.10:80/6"] == (B("10.65.0.1", 8080, "node1"),)
    assert got["fd00:96::10:80/6"] == (B("fd00:65::1", 8080, "node1"),)
    assert got["fd00:96::10:53/17"] == (B("fd00:65::1", 5353, "node1"),)
    h.put(svc("only6", "fd00:96::11", HTTP))
    assert h.backends()["fd00:96::11:80/6"] == ()  # no IPv6 slice: rejected, not dropped


def test_dual_stack_node_ports_get_one_frontend_per_family() -> None:
    """A NodePort Service with both cluster IP families gets an IPv4 NodePort frontend
    (0.0.0.0) with the IPv4 slice's endpoints and an IPv6 one (::) with the IPv6 slice's,
    both following externalTrafficPolicy; an IPv6-only Service only the IPv6 one."""
    h = Harness()
    ports = [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]
    six = eps("web-v6", "web", [("fd00:65::1", "node1", "ready"),
                                ("fd00:65::4", "node2", "ready")], SLICE_PORTS)
    six["addressType"] = "IPv6"
    h.put(svc("web", "10.96.0.10", ports, type="NodePort",
              clusterIPs=["10.96.0.10", "fd00:96::10"], ipFamilies=["IPv4", "IPv6"],
              ipFamilyPolicy="RequireDualStack"),
          eps("web-v4", "web", [("10.65.0.1", "node1", "ready")], SLICE_PORTS), six)
    got = h.backends()
    assert got["0.0.0.0:30080/6"] == (B("10.65.0.1", 8080, "node1"),)
    assert got[":::30080/6"] == (B("fd00:65::1", 8080, "node1"), B("fd00:65::4", 8080, "node2"))
    node_port6 = h.dataplane.service_frontends[":::30080/6"]
    assert (node_port6.kind, node_port6.vip) == ("nodeport", proto.NODEPORT_VIP6)
    h.put(svc("web", "10.96.0.10", ports, type="NodePort", externalTrafficPolicy="Local",
              clusterIPs=["10.96.0.10", "fd00:96::10"], ipFamilies=["IPv4", "IPv6"],
              ipFamilyPolicy="RequireDualStack"))
    assert h.backends()[":::30080/6"] == (B("fd00:65::1", 8080, "node1"),)
    sent = h.put(svc("web", "fd00:96::10", ports, type="NodePort"))
    assert proto.ServiceFrontendRemove(id="0.0.0.0:30080/6") in sent
    assert set(h.backends()) == {":::30080/6", "fd00:96::10:80/6"}
