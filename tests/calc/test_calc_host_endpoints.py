"""Host endpoints in the calc graph: each policy lands in the category the dataplane needs
(normal, doNotTrack -> untracked, preDNAT -> pre_dnat, applyOnForward -> forward too), for
an interface-named, a wildcard and an expectedIPs-only endpoint."""

from __future__ import annotations

from calc_testlib import gnp, hep

from pyfelix.agent import proto
from pyfelix.agent.calc import CalcPipeline, ExpectedDataplane
from pyfelix.agent.syncer.api import RawUpdate, SyncStatus, key_of

ALLOW = [{"action": "Allow"}]


def _host_endpoints(docs: list[dict]) -> dict[str, proto.HostEndpoint]:
    dataplane = ExpectedDataplane()
    CalcPipeline("node1", dataplane).feed([RawUpdate(key_of(d), d, "t") for d in docs],
                                          SyncStatus.IN_SYNC)
    return {hid.endpoint: ep for hid, ep in dataplane.host_endpoints.items()}


def _names(tiers: tuple[proto.TierInfo, ...]) -> tuple[list[str], list[str]]:
    return ([p for t in tiers for p in t.ingress_policies],
            [p for t in tiers for p in t.egress_policies])


def test_policy_categories_of_a_host_endpoint() -> None:
    docs = [
        hep("h1", "node1", "eth0", ["198.18.0.1"], labels={"host": "yes"}),
        gnp("normal", "has(host)", ingress=ALLOW, egress=ALLOW, order=1),
        gnp("forward", "has(host)", ingress=ALLOW, applyOnForward=True, order=2),
        gnp("untracked", "has(host)", ingress=ALLOW, egress=ALLOW, doNotTrack=True,
            applyOnForward=True, order=3),
        gnp("prednat", "has(host)", ingress=ALLOW, preDNAT=True, applyOnForward=True,
            order=4),
        hep("elsewhere", "node2", "eth0", ["198.18.0.2"], labels={"host": "yes"}),
    ]
    heps = _host_endpoints(docs)
    assert set(heps) == {"h1"}  # only this node's
    ep = heps["h1"]
    assert ep.name == "eth0" and ep.expected_ipv4_addrs == ("198.18.0.1",)
    assert _names(ep.tiers) == (["normal", "forward"], ["normal"])
    assert _names(ep.forward_tiers) == (["forward"], [])
    assert _names(ep.untracked_tiers) == (["untracked"], ["untracked"])
    assert _names(ep.pre_dnat_tiers) == (["prednat"], [])


def test_wildcard_and_expected_ips_only_endpoints() -> None:
    star = hep("all", "node1", "*", [], labels={"host": "yes"})
    by_ip = {"apiVersion": "projectcalico.org/v3", "kind": "HostEndpoint",
             "metadata": {"name": "by-ip"},
             "spec": {"node": "node1", "expectedIPs": ["198.18.0.1"]}}
    heps = _host_endpoints([star, by_ip])
    assert heps["all"].name == "*"
    # known only by its addresses: NOT every interface - the dataplane resolves the IPs
    assert heps["by-ip"].name == "" and heps["by-ip"].expected_ipv4_addrs == ("198.18.0.1",)
