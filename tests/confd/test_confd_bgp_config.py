"""compute_bird_config: the decisions, checked on the model (the goldens check the printing)."""

from __future__ import annotations

import ipaddress
import itertools

import pytest
from confd_fakes import (
    doc_bgp_config,
    doc_block,
    doc_node,
    doc_peer,
    doc_pool,
    upd,
)

from pyfelix.agent.model import BGPConfiguration, Metadata, PrefixAdvertisement
from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.confd.bgp_config import (
    BirdConfig,
    ConfdError,
    compute_bird_config,
    parse_duration_seconds,
)
from pyfelix.confd.bgp_view import state_from_updates


def compute(docs: list[dict], hostname: str = "node1") -> BirdConfig:
    state, problems = state_from_updates([upd(d) for d in docs])
    return compute_bird_config(state, hostname, problems=problems)


def sessions_by_ip(config: BirdConfig) -> dict[str, object]:
    return {s.neighbor_ip: s for s in config.sessions}


def export_decision(config: BirdConfig, route: str) -> str:
    """Evaluate the export filter on a route as BIRD would (first match wins)."""
    net = ipaddress.ip_network(route)
    for rule in config.export_rules:
        cidr = ipaddress.ip_network(rule.cidr)
        if (net == cidr) if rule.exact else net.subnet_of(cidr):
            return rule.action
    return "reject"


NODES = [doc_node("node1", "198.18.0.1/15"), doc_node("node2", "198.18.0.2/15"),
         doc_node("node3", "198.18.0.10/15")]


def test_defaults_as_64512_mesh_on_router_id_is_node_ipv4() -> None:
    config = compute(NODES)
    assert config.as_number == 64512
    assert config.router_id == "198.18.0.1"
    assert sorted(s.neighbor_ip for s in config.sessions) == ["198.18.0.10", "198.18.0.2"]
    assert all(s.protocol_name.startswith("Mesh_") for s in config.sessions)


def test_mesh_exactly_one_side_of_each_pair_is_passive() -> None:
    configs = {n: compute(NODES, n) for n in ("node1", "node2", "node3")}
    address = {"node1": "198.18.0.1", "node2": "198.18.0.2", "node3": "198.18.0.10"}
    for a, b in itertools.combinations(configs, 2):
        a_side = sessions_by_ip(configs[a])[address[b]]
        b_side = sessions_by_ip(configs[b])[address[a]]
        assert a_side.passive != b_side.passive  # type: ignore[attr-defined]
        # the numerically higher address connects (10 > 2, although "10" < "2" as strings)
        higher = max((a, b), key=lambda n: ipaddress.ip_address(address[n]))
        connecting = a_side if higher == a else b_side
        assert not connecting.passive  # type: ignore[attr-defined]


def test_mesh_off_removes_mesh_sessions_only() -> None:
    docs = [*NODES, doc_bgp_config(nodeToNodeMeshEnabled=False),
            doc_peer("tor", peerIP="198.19.0.1", asNumber=65100)]
    config = compute(docs)
    assert [s.protocol_name for s in config.sessions] == ["Global_198_19_0_1"]


def test_per_node_as_each_peer_gets_its_own_as() -> None:
    docs = [doc_node("node1", "198.18.0.1/15", as_number=65001),
            doc_node("node2", "198.18.0.2/15", as_number=65002),
            doc_node("node3", "198.18.0.3/15"), doc_bgp_config(asNumber=65000)]
    config = compute(docs)
    assert config.as_number == 65001
    by_ip = sessions_by_ip(config)
    assert by_ip["198.18.0.2"].neighbor_as == 65002  # type: ignore[attr-defined]
    assert by_ip["198.18.0.3"].neighbor_as == 65000  # type: ignore[attr-defined]
    assert {s.local_as for s in config.sessions} == {65001}


def test_node_specific_peer_only_on_its_node_and_selector_peers_by_labels() -> None:
    docs = [doc_node("node1", "198.18.0.1/15", labels={"rack": "a"}),
            doc_node("node2", "198.18.0.2/15", labels={"rack": "b"}),
            doc_bgp_config(nodeToNodeMeshEnabled=False),
            doc_peer("mine", node="node1", peerIP="198.19.0.1", asNumber=65100),
            doc_peer("rack-b", nodeSelector="rack == 'b'", peerIP="198.19.0.2", asNumber=65100)]
    assert [s.neighbor_ip for s in compute(docs, "node1").sessions] == ["198.19.0.1"]
    assert [s.neighbor_ip for s in compute(docs, "node2").sessions] == ["198.19.0.2"]


def test_peer_selector_is_symmetric_and_never_selects_self() -> None:
    docs = [doc_node("a", "198.18.0.1/15", labels={"role": "x"}),
            doc_node("b", "198.18.0.2/15", labels={"role": "y"}),
            doc_node("c", "198.18.0.3/15", labels={"role": "y"}),
            doc_bgp_config(nodeToNodeMeshEnabled=False),
            doc_peer("x-to-y", nodeSelector="role == 'x'", peerSelector="role == 'y'")]
    assert sorted(sessions_by_ip(compute(docs, "a"))) == ["198.18.0.2", "198.18.0.3"]
    assert sorted(sessions_by_ip(compute(docs, "b"))) == ["198.18.0.1"]  # the reverse side
    both = [*docs[:4], doc_peer("all", peerSelector="all()")]
    assert sorted(sessions_by_ip(compute(both, "b"))) == ["198.18.0.1", "198.18.0.3"]


def test_route_reflector_marks_non_reflector_ibgp_peers_as_clients() -> None:
    docs = [doc_node("rr1", "198.18.0.100/15", cluster_id="224.0.0.1", labels={"rr": "1"}),
            doc_node("rr2", "198.18.0.101/15", cluster_id="224.0.0.1", labels={"rr": "1"}),
            doc_node("node1", "198.18.0.1/15"),
            doc_node("ebgp", "198.18.0.5/15", as_number=65099),
            doc_bgp_config(nodeToNodeMeshEnabled=False),
            doc_peer("to-rr", peerSelector="rr == '1'")]
    rr = sessions_by_ip(compute(docs, "rr1"))
    assert rr["198.18.0.1"].rr_cluster_id == "224.0.0.1"  # type: ignore[attr-defined]
    assert rr["198.18.0.101"].rr_cluster_id is None  # type: ignore[attr-defined]
    assert rr["198.18.0.5"].rr_cluster_id is None  # eBGP: never a client
    client = sessions_by_ip(compute(docs, "node1"))
    assert sorted(client) == ["198.18.0.100", "198.18.0.101"]
    assert all(s.rr_cluster_id is None for s in client.values())  # type: ignore[attr-defined]


def test_duplicate_neighbor_node_specific_wins_over_global_and_mesh() -> None:
    docs = [*NODES, doc_peer("global", peerIP="198.18.0.2", asNumber=64512),
            doc_peer("specific", node="node1", peerIP="198.18.0.2", asNumber=64512,
                     keepOriginalNextHop=True)]
    config = compute(docs)
    session = sessions_by_ip(config)["198.18.0.2"]
    assert session.protocol_name == "Node_198_18_0_2"  # type: ignore[attr-defined]
    assert session.next_hop_keep  # type: ignore[attr-defined]
    assert len([s for s in config.sessions if s.neighbor_ip == "198.18.0.2"]) == 1
    assert any("BGPPeer(global)" in n and "skipped" in n for n in config.notes)


def test_export_blocks_pools_and_covered_routes() -> None:
    docs = [*NODES, doc_pool("main", "10.65.0.0/16"),
            doc_pool("off", "10.65.128.0/17", disabled=True),
            doc_pool("noexport", "10.67.0.0/16", disableBGPExport=True),
            doc_pool("vx", "10.68.0.0/16", vxlanMode="Always"),
            doc_block("b1", "node1", "10.65.1.0/26"),
            doc_block("b2", "node1", "10.65.130.0/26"),
            doc_block("other", "node2", "10.65.2.0/26")]
    config = compute(docs)
    assert config.local_blocks == ("10.65.1.0/26",)
    expectations = {
        "10.65.1.0/26": "accept",  # our block
        "10.65.1.5/32": "reject",  # covered by our block
        "10.65.9.5/32": "accept",  # a borrowed IP outside our blocks, in an enabled pool
        "10.65.2.0/26": "accept",  # another node's block (reflected / transit)
        "10.65.130.7/32": "reject",  # disabled pool nested in the enabled one
        "10.67.0.9/32": "reject",
        "10.68.0.9/32": "reject",  # VXLAN: Felix programs it
        "192.168.1.0/24": "reject",  # not a pool
    }
    assert {r: export_decision(config, r) for r in expectations} == expectations
    assert [r.cidr for r in config.kernel_export_rejects] == ["10.68.0.0/16"]


def test_ipip_pools_are_exported_to_peers_but_kept_out_of_the_kernel() -> None:
    # the agent's IPIP manager programs the routes via tunl0 onlink (stock BIRD cannot)
    docs = [*NODES, doc_pool("ip", "10.69.0.0/16", ipipMode="CrossSubnet"),
            doc_pool("vx", "10.68.0.0/16", vxlanMode="Always")]
    config = compute(docs)
    assert export_decision(config, "10.69.0.9/32") == "accept"
    assert export_decision(config, "10.68.0.9/32") == "reject"
    assert [(r.cidr, r.reason) for r in config.kernel_export_rejects] == [
        ("10.68.0.0/16", "IPPool vx uses VXLAN"), ("10.69.0.0/16", "IPPool ip uses IPIP")]
    assert not any("ipipMode" in n for n in config.notes)


def test_services_and_community_tagging() -> None:
    docs = [*NODES, doc_bgp_config(
        serviceClusterIPs=[{"cidr": "10.96.0.0/12"}],
        serviceExternalIPs=[{"cidr": "10.96.0.0/12"}, {"cidr": "2001:db8::/64"}],
        communities=[{"name": "c", "value": "65001:100"}],
        prefixAdvertisements=[{"cidr": "10.65.0.0/16", "communities": ["c", "1:2:3"]}])]
    config = compute(docs)
    assert config.service_cidrs == ("10.96.0.0/12",)
    assert [(t.cidr, t.communities, t.large_communities) for t in config.community_tagging] == [
        ("10.65.0.0/16", ("(65001, 100)",), ("(1, 2, 3)",))]
    assert any("2001:db8::/64" in n for n in config.notes)


def test_invalid_community_in_global_config_refuses_to_render() -> None:
    docs = [*NODES, doc_bgp_config(
        prefixAdvertisements=[{"cidr": "10.65.0.0/16", "communities": ["70000:1"]}])]
    with pytest.raises(ConfdError, match=r"prefixAdvertisements\[0\]\.communities\[0\]"):
        compute(docs)


def test_community_checked_again_by_confd_skips_the_advertisement_with_a_note() -> None:
    # the model validates communities too; confd does not rely on it for BIRD's syntax
    state, _ = state_from_updates([upd(d) for d in NODES])
    key = ResourceKey("BGPConfiguration", "", "default")
    state.bgp_configurations["default"] = BGPConfiguration(
        key, Metadata("default"),
        prefix_advertisements=(PrefixAdvertisement("10.65.0.0/16", ("65536:1",)),
                               PrefixAdvertisement("10.66.0.0/16", ("1:2",))))
    config = compute_bird_config(state, "node1")
    assert [t.cidr for t in config.community_tagging] == ["10.66.0.0/16"]
    assert any("prefixAdvertisements[0].communities[0]" in n for n in config.notes)


def test_passwords_timers_and_source_address() -> None:
    docs = [*NODES, doc_bgp_config(nodeMeshPassword={"value": "m"},
                                   nodeMeshMaxRestartTime="1m30s"),
            doc_peer("tor", peerIP="198.19.0.1", asNumber=65100, password={"value": "p w"},
                     keepaliveTime="100s", sourceAddress="None")]
    by_ip = sessions_by_ip(compute(docs))
    mesh, tor = by_ip["198.18.0.2"], by_ip["198.19.0.1"]
    assert (mesh.password, mesh.graceful_restart_time) == ("m", 90)  # type: ignore[attr-defined]
    assert (tor.password, tor.keepalive_time, tor.hold_time, tor.local_ip) == (  # type: ignore[attr-defined]
        "p w", 100, 300, None)


@pytest.mark.parametrize("password", ['a"b', "a\\b", "line\nbreak"])
def test_unquotable_password_skips_the_peer_naming_the_field(password: str) -> None:
    docs = [*NODES, doc_peer("tor", peerIP="198.19.0.1", asNumber=65100,
                             password={"value": password})]
    config = compute(docs)
    assert "198.19.0.1" not in sessions_by_ip(config)
    assert any(n.startswith("BGPPeer(tor): spec.password:") for n in config.notes)


def test_custom_listen_port_used_locally_and_for_mesh_neighbors() -> None:
    docs = [*NODES, doc_bgp_config(listenPort=1790),
            doc_peer("tor", peerIP="198.19.0.1:10179", asNumber=65100),
            doc_peer("tor-default", peerIP="198.19.0.2", asNumber=65100)]
    by_ip = sessions_by_ip(compute(docs))
    assert {s.local_port for s in by_ip.values()} == {1790}  # type: ignore[attr-defined]
    assert by_ip["198.18.0.2"].neighbor_port == 1790  # type: ignore[attr-defined]
    assert by_ip["198.19.0.1"].neighbor_port == 10179  # type: ignore[attr-defined]
    assert by_ip["198.19.0.2"].neighbor_port is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("docs", "message"), [
    ([doc_node("node2", "198.18.0.2/15")], "Node(node1): not in the datastore"),
    ([doc_node("node1", None)], "Node(node1): spec.bgp.ipv4Address: required"),
    ([doc_node("node1", "fd00::1/64")], "is not an IPv4 address"),
])
def test_node_without_usable_bgp_address_is_an_error_naming_the_field(
        docs: list[dict], message: str) -> None:
    with pytest.raises(ConfdError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compute(docs)


def test_invalid_global_bgp_configuration_refuses_to_fall_back_to_defaults() -> None:
    docs = [*NODES, doc_bgp_config(nodeToNodeMeshEnabled=False, listenPort=99999)]
    with pytest.raises(ConfdError, match=r"BGPConfiguration\(default\): spec.listenPort"):
        compute(docs)


def test_invalid_other_resource_is_left_out_and_noted() -> None:
    docs = [*NODES, doc_peer("broken", peerIP="198.19.0.1")]  # no asNumber
    config = compute(docs)
    assert "198.19.0.1" not in sessions_by_ip(config)
    assert any("BGPPeer(broken): spec.asNumber" in n for n in config.notes)


@pytest.mark.parametrize(("text", "seconds"), [("120", 120), ("120s", 120), ("2m", 120),
                                               ("1m30s", 90), ("1h", 3600), ("1500ms", None),
                                               ("0s", None), ("soon", None), ("", None)])
def test_parse_duration_seconds(text: str, seconds: int | None) -> None:
    if seconds is None:
        with pytest.raises(ConfdError, match="BGPPeer"):
            parse_duration_seconds(text, "BGPPeer(x): spec.maxRestartTime")
    else:
        assert parse_duration_seconds(text, "x") == seconds


@pytest.mark.parametrize(("severity", "classes", "debug"), [
    ("Debug", "all", "all"), ("Info", "{ info, remote, warning, error, auth, fatal, bug }",
                              "{ states }"), ("Error", "{ error, auth, fatal, bug }", "off")])
def test_log_severity_maps_to_bird_log_classes(severity: str, classes: str, debug: str) -> None:
    config = compute([*NODES, doc_bgp_config(logSeverityScreen=severity)])
    assert (config.log.classes, config.log.debug_protocols) == (classes, debug)


def test_bad_interface_prefix_is_an_error() -> None:
    state, _ = state_from_updates([upd(d) for d in NODES])
    with pytest.raises(ConfdError, match="interface prefix"):
        compute_bird_config(state, "node1", interface_prefix='ca"li')


def test_dual_stack_overlay_twins_per_family() -> None:
    """The lab's dual-stack overlays: an IPv6 VXLAN pool is kept out of BIRD's IPv6 kernel
    export (the agent's vxlan-v6.calico routes it) and not advertised; the IPv6 twin of an
    IPIP pool (ipipMode Never: Calico has no IPv6 IPIP) is a plain BGP-routed pool."""
    nodes = [doc_node(f"node{i}", f"198.18.0.{i}/15") for i in (1, 2)]
    for n, i in zip(nodes, (1, 2), strict=True):
        n["spec"]["bgp"]["ipv6Address"] = f"fd00:18::{i}/64"
    docs = [*nodes, doc_pool("vx", "10.68.0.0/16", vxlanMode="Always"),
            doc_pool("vx-v6", "fd00:68::/112", vxlanMode="Always"),
            doc_pool("ip", "10.69.0.0/16", ipipMode="Always"),
            doc_pool("ip-v6", "fd00:69::/112", ipipMode="Never")]
    config = compute(docs)
    assert config.ipv6 is not None
    assert [(r.cidr, r.reason) for r in config.ipv6.kernel_export_rejects] == [
        ("fd00:68::/112", "IPPool vx-v6 uses VXLAN")]
    assert [r.cidr for r in config.kernel_export_rejects] == ["10.68.0.0/16", "10.69.0.0/16"]
    export6 = {r.cidr: r.accept for r in config.ipv6.export_rules}
    assert export6 == {"fd00:68::/112": False, "fd00:69::/112": True}
