"""Two real BIRDs in namespaces this test creates, each driven by a real confd loop over a
file datastore: BGP passwords from v1 Secrets, BGPFilter, per-service advertisement.

The namespaces, veth, BIRD processes and confd loops come from the `lab` fixture of
test_priv_confd_bgp (via conftest.py; created inside the namespaces, torn down on success
and failure, the root namespace checked unchanged). The mesh is off: each node has one
explicit BGPPeer to the other, so what a test changes on one side is all that differs.
"""

from __future__ import annotations

import base64
import logging
import stat
import time
from collections.abc import Callable

import pytest

from pyfelix.confd.bird import BirdInstance, BirdTools
from tests.privileged.confd.test_priv_confd_bgp import (
    ESTABLISH_BOUND,
    NODE_IPS,
    Lab,
    route_line,
    sh,
    start_confd,
    wait_for,
)

pytestmark = pytest.mark.privileged

SECRET_NAMESPACE = "calico-system"
RIGHT = "Right-pw-0b7c4e"
WRONG = "Wrong-pw-93aa1f"
DOWN_WINDOW = 12.0  # > two of BIRD's connect retries (5 s, template pyfelix_peer)


def _doc(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "projectcalico.org/v3", "kind": kind, "metadata": {"name": name},
            "spec": spec}


def _cluster(peer_specs: dict[str, dict]) -> list[dict]:
    """Nodes, a pool, mesh off, and one BGPPeer per node towards the other node."""
    other = {"node1": "node2", "node2": "node1"}
    docs = [_doc("BGPConfiguration", "default", {"nodeToNodeMeshEnabled": False}),
            _doc("IPPool", "pods", {"cidr": "10.65.0.0/16"})]
    for name, ip in NODE_IPS.items():
        docs.append(_doc("Node", name, {"bgp": {"ipv4Address": f"{ip}/15"}}))
        docs.append(_doc("BGPPeer", f"{name}-to-{other[name]}", {
            "node": name, "peerIP": NODE_IPS[other[name]], "asNumber": 64512,
            **peer_specs.get(name, {})}))
    return docs


def _secret(value: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "bgp-secrets", "namespace": SECRET_NAMESPACE},
            "type": "Opaque", "data": {"peer": base64.b64encode(value.encode()).decode()}}


def _start_birds(lab: Lab) -> None:
    for node in NODE_IPS:
        wait_for(f"{node}: first config", (lab.dir / node / "bird.conf").exists, 10)
    for node in NODE_IPS:
        bird = BirdInstance(lab.netns[node], lab.dir / node / "bird.conf",
                            lab.dir / node / "bird.ctl", run_dir=lab.dir / node)
        lab.birds[node] = bird
        bird.start()


def _session(lab: Lab, node: str) -> str:
    """The BGP session's state and info on `node` ("" when BIRD has none)."""
    states = [p for p in BirdTools().protocols(lab.birds[node].socket_path) if p.proto == "BGP"]
    return " ".join(f"{p.state} {p.info}" for p in states)


def _established(lab: Lab, node: str) -> bool:
    return "Established" in _session(lab, node)


def _stays_down(lab: Lab, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for node in NODE_IPS:
            assert not _established(lab, node), f"{node}: session up with a wrong password"
        time.sleep(0.2)


def _wait_reloaded(lab: Lab, node: str, needle: str, present: bool = True) -> None:
    wait_for(f"{node}: config {'with' if present else 'without'} {needle!r}",
             lambda: (needle in (lab.reconcilers[node].applied_text or "")) is present, 10)


def test_password_from_secret_up_wrong_down_fixed_up(
        lab: Lab, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        record_property: Callable[[str, object], None]) -> None:
    """node1 takes its password from Secret calico-system/bgp-secrets (the namespace comes
    from NAMESPACE, as calico-node's); node2 has the right one inline. Right -> Established;
    the Secret changed to a wrong value -> confd reloads BIRD and the session stays down;
    changed back -> Established again. The value is in bird.conf (0600) only: not in any
    log record of confd, nor in its errors."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("NAMESPACE", SECRET_NAMESPACE)
    lab.write_resources("cluster", _cluster({
        "node1": {"password": {"secretKeyRef": {"name": "bgp-secrets", "key": "peer"}}},
        "node2": {"password": {"value": RIGHT}}}))
    lab.write_resources("secret", [_secret(RIGHT)])
    for node in NODE_IPS:
        start_confd(lab, node)
    _start_birds(lab)
    config1 = lab.dir / "node1" / "bird.conf"
    assert f'password "{RIGHT}";' in config1.read_text()
    assert stat.S_IMODE(config1.stat().st_mode) == 0o600
    up = wait_for("right password: Established", lambda: _established(lab, "node1")
                  and _established(lab, "node2"), ESTABLISH_BOUND)
    record_property("right_password_to_established_s", round(up, 3))

    lab.write_resources("secret", [_secret(WRONG)])
    _wait_reloaded(lab, "node1", f'password "{WRONG}";')
    wait_for("wrong password: session down", lambda: not _established(lab, "node1"), 15)
    _stays_down(lab, DOWN_WINDOW)
    assert stat.S_IMODE(config1.stat().st_mode) == 0o600

    start = time.monotonic()
    lab.write_resources("secret", [_secret(RIGHT)])
    _wait_reloaded(lab, "node1", f'password "{RIGHT}";')
    wait_for("password fixed: Established again", lambda: _established(lab, "node1")
             and _established(lab, "node2"), ESTABLISH_BOUND)
    record_property("secret_fixed_to_established_s", round(time.monotonic() - start, 3))

    # a missing key: node1 renders no session at all (fail closed) and says why
    lab.write_resources("secret", [{**_secret(RIGHT), "data": {"other": "eA=="}}])
    _wait_reloaded(lab, "node1", "neighbor 198.18.0.2", present=False)
    assert ("BGPPeer(node1-to-node2): spec.password.secretKeyRef: Secret "
            f"{SECRET_NAMESPACE}/bgp-secrets has no key 'peer'") in caplog.text
    assert not lab.reconcilers["node1"].last_error
    for value in (RIGHT, WRONG):
        assert value not in caplog.text
        for node in NODE_IPS:
            assert value not in lab.reconcilers[node].last_error


def _pod_routes(lab: Lab, node: str, *prefixes: str) -> None:
    """Pod /32s on a `cali` veth of `node`, as Felix programs them (BIRD learns them)."""
    ns = lab.netns[node]
    sh("ip", "-n", ns, "link", "add", "cali0123456789c", "type", "veth", "peer", "name", "podx")
    sh("ip", "-n", ns, "link", "set", "cali0123456789c", "up")
    sh("ip", "-n", ns, "link", "set", "podx", "up")
    for prefix in prefixes:
        sh("ip", "-n", ns, "route", "add", prefix, "dev", "cali0123456789c")


def _bird_has(lab: Lab, node: str, prefix: str) -> bool:
    text = BirdTools().show_route(lab.birds[node].socket_path, prefix).message
    return any(line.startswith(prefix) for line in text.splitlines())


def test_bgp_filter_keeps_one_cidr_out_and_lets_another_through(lab: Lab) -> None:
    """node1 exports through a BGPFilter rejecting 10.65.7.0/24; node2 imports through one
    rejecting /32s inside 10.65.9.0/24. Of three pod routes on node1 only 10.65.8.5 reaches
    node2's BIRD table and kernel; once the filters are removed from the peers, the two
    filtered ones arrive too (so it was the filters that kept them out)."""
    filters = [
        _doc("BGPFilter", "no-7", {"exportV4": [
            {"action": "Reject", "matchOperator": "In", "cidr": "10.65.7.0/24"}]}),
        _doc("BGPFilter", "no-9-hosts", {"importV4": [
            {"action": "Reject", "matchOperator": "In", "cidr": "10.65.9.0/24",
             "prefixLength": {"min": 32}}]}),
    ]
    lab.write_resources("cluster", _cluster({"node1": {"filters": ["no-7"]},
                                             "node2": {"filters": ["no-9-hosts"]}}) + filters)
    for node in NODE_IPS:
        start_confd(lab, node)
    _start_birds(lab)
    assert "'pyfelix_bgpfilter_no-7_export4'();" in (lab.dir / "node1" / "bird.conf").read_text()
    wait_for("Established", lambda: _established(lab, "node1") and _established(lab, "node2"),
             ESTABLISH_BOUND)
    _pod_routes(lab, "node1", "10.65.7.5/32", "10.65.8.5/32", "10.65.9.5/32")
    ns2 = lab.netns["node2"]
    wait_for("10.65.8.5 on node 2", lambda: "via 198.18.0.1" in route_line(ns2, "10.65.8.5/32"),
             10)
    for prefix in ("10.65.7.5/32", "10.65.9.5/32"):  # learned by node1 at the same scan
        assert _bird_has(lab, "node1", prefix)
    time.sleep(3)  # > a kernel scan (2 s) and an update round
    assert not _bird_has(lab, "node2", "10.65.7.5/32")
    assert not _bird_has(lab, "node2", "10.65.9.5/32")
    assert route_line(ns2, "10.65.7.5/32") == route_line(ns2, "10.65.9.5/32") == ""
    exported = BirdTools().show_route(lab.birds["node1"].socket_path, "export",
                                      "Node_198_18_0_2").message
    assert "10.65.8.5/32" in exported and "10.65.9.5/32" in exported
    assert "10.65.7.5/32" not in exported

    lab.write_resources("cluster", _cluster({}) + filters)
    for prefix in ("10.65.7.5/32", "10.65.9.5/32"):
        wait_for(f"{prefix} on node 2 without the filters",
                 lambda p=prefix: "via 198.18.0.1" in route_line(ns2, p), 15)


def _local_service() -> list[dict]:
    return [
        _doc("BGPConfiguration", "default", {"nodeToNodeMeshEnabled": False,
                                             "serviceClusterIPs": [{"cidr": "10.96.0.0/12"}]}),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
         "spec": {"clusterIP": "10.96.5.10", "externalTrafficPolicy": "Local",
                  "type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}},
    ]


def _slice(endpoints: list[tuple[str, str, bool]]) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [{"port": 80, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "nodeName": node, "conditions": {"ready": ready}}
                          for ip, node, ready in endpoints]}


def _bgp_route_via(lab: Lab, node: str, prefix: str) -> str:
    """The next hop of `node`'s BGP-learned route for `prefix` in BIRD ("" when none)."""
    text = BirdTools().show_route(lab.birds[node].socket_path, prefix, "protocol",
                                  f"Node_{NODE_IPS[_other(node)].replace('.', '_')}").message
    for line in text.splitlines():
        if "via" in line:
            return line.split("via", 1)[1].split()[0]
    return ""


def _other(node: str) -> str:
    return "node2" if node == "node1" else "node1"


def test_local_service_ip_advertised_only_from_the_node_with_its_endpoint(lab: Lab) -> None:
    """A Local service's /32: node2 has its ready endpoint, so node1's table and kernel have
    10.96.5.10/32 via node2 and node2 learns no /32 from node1; the endpoint moves to node1:
    the route flips; the endpoint turns not ready: withdrawn everywhere (the /12 range
    itself stays advertised by both)."""
    lab.write_resources("cluster", [d for d in _cluster({}) if d["kind"] != "BGPConfiguration"]
                        + _local_service())
    lab.write_resources("slices", [_slice([("10.65.2.5", "node2", True)])])
    for node in NODE_IPS:
        start_confd(lab, node)
    _start_birds(lab)
    wait_for("Established", lambda: _established(lab, "node1") and _established(lab, "node2"),
             ESTABLISH_BOUND)
    ns1, ns2 = lab.netns["node1"], lab.netns["node2"]
    wait_for("node1 learns 10.96.5.10/32 from node2",
             lambda: "via 198.18.0.2" in route_line(ns1, "10.96.5.10/32"), 10)
    assert _bgp_route_via(lab, "node1", "10.96.5.10/32") == "198.18.0.2"
    wait_for("both learn the other's /12", lambda: _bgp_route_via(lab, "node1", "10.96.0.0/12")
             == "198.18.0.2" and _bgp_route_via(lab, "node2", "10.96.0.0/12") == "198.18.0.1",
             10)
    assert _bgp_route_via(lab, "node2", "10.96.5.10/32") == ""
    assert route_line(ns2, "10.96.5.10/32") == ""  # node2's own blackhole is not programmed

    lab.write_resources("slices", [_slice([("10.65.2.5", "node2", False),
                                           ("10.65.1.5", "node1", True)])])
    wait_for("the /32 moves to node1",
             lambda: "via 198.18.0.1" in route_line(ns2, "10.96.5.10/32")
             and route_line(ns1, "10.96.5.10/32") == "", 15)
    assert _bgp_route_via(lab, "node1", "10.96.5.10/32") == ""

    lab.write_resources("slices", [_slice([("10.65.1.5", "node1", False)])])
    wait_for("no ready endpoint: withdrawn everywhere",
             lambda: route_line(ns1, "10.96.5.10/32") == route_line(ns2, "10.96.5.10/32") == ""
             and not _bgp_route_via(lab, "node1", "10.96.5.10/32")
             and not _bgp_route_via(lab, "node2", "10.96.5.10/32"), 15)
    for node in NODE_IPS:
        assert "10.96.5.10/32" not in (lab.reconcilers[node].applied_text or "")
    assert _bgp_route_via(lab, "node1", "10.96.0.0/12") == "198.18.0.2"
