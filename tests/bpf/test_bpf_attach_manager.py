"""BpfAttachManager on a FakeAttacher: our programs on every workload interface, idempotent,
stale programs of an earlier build replaced, nothing that is not ours touched, XDP only where
host endpoints have untracked policy."""

from __future__ import annotations

import logging

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf.attach import AttachError, TcFilter, filter_name
from pyfelix.agent.dataplane.events import IFACE_ABSENT, IFACE_DOWN, IFACE_UP, InterfaceUpdate
from pyfelix.agent.dataplane.managers.bpf_attach import BpfAttachManager, ProgramRef
from tests.bpf.fakes import FakeAttacher

FROM = ProgramRef(fd=101, prog_id=501, name="calico_from_wep")
TO = ProgramRef(fd=102, prog_id=502, name="calico_to_wep")
XDP = ProgramRef(fd=103, prog_id=503, name="calico_xdp")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def setup(**kw) -> tuple[BpfAttachManager, FakeAttacher, list[int]]:
    fake = FakeAttacher()
    fake.programs = {503: "calico_xdp"}
    fake.xdp_fds = {103: 503}
    fake.add_link("lo", 1)
    fake.add_link("eth0", 2)
    fake.add_link("cali1", 11)
    swept: list[int] = []
    m = BpfAttachManager({"ingress": FROM, "egress": TO}, XDP, attacher=fake,
                         on_all_current=lambda: swept.append(1), **kw)
    return m, fake, swept


def ours(fake: FakeAttacher, name: str) -> dict[str, list[str]]:
    return {hook: [f.name for f in fs] for hook, fs in fake.links[name].filters.items()}


CURRENT = {"ingress": [filter_name("calico_from_wep", 501)],
           "egress": [filter_name("calico_to_wep", 502)]}


def test_attaches_to_workload_interfaces_only_and_is_idempotent():
    m, fake, _ = setup()
    m.apply()
    assert ours(fake, "cali1") == CURRENT
    assert fake.links["cali1"].fds == {("ingress", 1, 1): 101, ("egress", 1, 1): 102}
    assert ours(fake, "eth0") == {"ingress": [], "egress": []}
    assert not fake.links["eth0"].clsact and not fake.links["lo"].clsact
    before = fake.mutations
    m.apply()
    m.request_resync()
    m.apply()
    assert fake.mutations == before


def test_new_interface_is_attached_in_the_next_apply_with_its_latency_recorded():
    clock = Clock()
    m, fake, _ = setup(clock=clock)
    m.apply()
    fake.add_link("cali2", 12)
    m.on_update(InterfaceUpdate("cali2", 12, IFACE_DOWN))  # down interfaces get them too
    m.on_update(InterfaceUpdate("veth9", 13, IFACE_UP))  # not a workload interface
    clock.now += 0.25
    m.apply()
    assert ours(fake, "cali2") == CURRENT
    assert 12 in m.attached and 13 not in m.attached
    assert m.attach_latencies[-1] == pytest.approx(0.25)


def test_stale_program_of_an_earlier_build_is_replaced_and_foreign_filters_kept():
    m, fake, _ = setup()
    cali1 = fake.links["cali1"]
    cali1.clsact = True
    cali1.filters["ingress"] = [TcFilter(1, 1, "bpf", filter_name("calico_from_wep", 7)),
                                TcFilter(5, 1, "u32", "someone-else"),
                                TcFilter(9, 3, "bpf", filter_name("calico_from_wep", 6))]
    cali1.filters["egress"] = [TcFilter(2, 1, "bpf", "other-tool")]
    m.apply()
    assert ours(fake, "cali1") == {
        "ingress": ["someone-else", filter_name("calico_from_wep", 501)],  # old extra gone
        "egress": ["other-tool", filter_name("calico_to_wep", 502)],
    }


def test_foreign_filter_at_our_slot_is_an_error_and_left_alone():
    m, fake, _ = setup()
    cali1 = fake.links["cali1"]
    cali1.clsact = True
    cali1.filters["ingress"] = [TcFilter(1, 1, "bpf", "not-ours")]
    with pytest.raises(AttachError, match="not ours"):
        m.apply()
    assert ours(fake, "cali1")["ingress"] == ["not-ours"]
    assert 11 not in m.attached


def test_interface_that_vanishes_is_forgotten_not_an_error():
    m, fake, _ = setup()
    m.on_update(InterfaceUpdate("cali2", 12, IFACE_UP))  # reported, but already gone
    m.apply()
    assert 12 not in m.attached
    m.on_update(InterfaceUpdate("cali1", 11, IFACE_ABSENT))
    fake.remove_link("cali1")
    m.apply()
    assert m.attached == frozenset()


def test_xdp_follows_host_endpoints_with_untracked_policy():
    m, fake, _ = setup()
    hep = p.HostEndpointID("node1-eth0")
    m.on_update(p.InSync())
    m.on_update(p.HostEndpointUpdate(hep, p.HostEndpoint(
        "eth0", untracked_tiers=(p.TierInfo("default", ingress_policies=("x",)),))))
    m.apply()
    assert fake.links["eth0"].xdp_prog_id == 503
    assert fake.links["cali1"].xdp_prog_id == 0 and fake.links["lo"].xdp_prog_id == 0
    m.on_update(p.HostEndpointRemove(hep))
    m.apply()
    assert fake.links["eth0"].xdp_prog_id == 0


def test_foreign_xdp_program_is_not_replaced():
    m, fake, _ = setup()
    fake.programs[900] = "someone_xdp"
    fake.links["eth0"].xdp_prog_id = 900
    m.on_update(p.HostEndpointUpdate(p.HostEndpointID("h"), p.HostEndpoint(
        "*", untracked_tiers=(p.TierInfo("default", ingress_policies=("x",)),))))
    with pytest.raises(AttachError, match="not ours"):
        m.apply()
    assert fake.links["eth0"].xdp_prog_id == 900


def test_stale_xdp_of_ours_is_removed_after_in_sync_only():
    m, fake, _ = setup()
    fake.programs[400] = "calico_xdp"  # an earlier build's program, left on eth0
    fake.links["eth0"].xdp_prog_id = 400
    m.apply()
    assert fake.links["eth0"].xdp_prog_id == 400
    m.on_update(p.InSync())
    m.apply()
    assert fake.links["eth0"].xdp_prog_id == 0


def test_old_build_pins_swept_once_after_in_sync_when_all_attached():
    m, _fake, swept = setup()
    m.apply()
    m.finish_apply()
    assert swept == []  # not before in-sync
    m.on_update(p.InSync())
    m.apply()
    m.finish_apply()
    m.finish_apply()
    assert swept == [1]


def test_close_closes_the_attacher_and_releases_the_build():
    m, fake, _ = setup()
    released = []
    m.on_close = lambda: released.append(1)
    m.apply()
    m.close()
    assert fake.closed and released == [1]
    assert ours(fake, "cali1") == CURRENT  # programs stay attached


def test_xdp_for_a_host_endpoint_known_by_its_expected_ips():
    from pyfelix.agent.dataplane.events import InterfaceAddrsUpdate

    m, fake, _ = setup()
    fake.add_link("eth1", 3)
    m.on_update(p.InSync())
    m.on_update(InterfaceAddrsUpdate("eth0", frozenset({"198.18.0.1/15"})))
    m.on_update(InterfaceAddrsUpdate("eth1", frozenset({"192.0.2.1/24"})))
    m.on_update(p.HostEndpointUpdate(p.HostEndpointID("by-ip"), p.HostEndpoint(
        "", expected_ipv4_addrs=("192.0.2.1",),
        untracked_tiers=(p.TierInfo("default", ingress_policies=("x",)),))))
    m.request_resync()  # learn eth1 from the kernel listing
    m.apply()
    assert fake.links["eth1"].xdp_prog_id == 503
    assert fake.links["eth0"].xdp_prog_id == 0
    m.on_update(InterfaceAddrsUpdate("eth1", frozenset()))  # the address moved away
    m.apply()
    assert fake.links["eth1"].xdp_prog_id == 0


HEP = ProgramRef(fd=104, prog_id=504, name="calico_from_hep")


def test_reverse_path_program_follows_every_host_endpoint_and_only_ours_is_removed():
    m, fake, _ = setup(hep_program=HEP)
    fake.add_link("eth1", 3)
    m.on_update(p.InSync())
    hep = p.HostEndpointID("node1-eth0")
    m.on_update(p.HostEndpointUpdate(hep, p.HostEndpoint("eth0", profile_ids=("open",))))
    m.apply()
    assert ours(fake, "eth0") == {"ingress": [filter_name("calico_from_hep", 504)],
                                  "egress": []}
    assert fake.links["eth0"].fds == {("ingress", 1, 1): 104}
    assert not fake.links["eth1"].clsact and not fake.links["lo"].clsact
    assert ours(fake, "cali1") == CURRENT  # workload interfaces keep their own programs
    assert m.host_endpoint_interfaces == {2}
    before = fake.mutations
    m.apply()
    assert fake.mutations == before
    # a foreign filter beside ours stays when the host endpoint goes
    fake.links["eth0"].filters["ingress"].append(TcFilter(5, 1, "bpf", "foreign"))
    m.on_update(p.HostEndpointRemove(hep))
    m.apply()
    assert ours(fake, "eth0") == {"ingress": ["foreign"], "egress": []}
    assert m.host_endpoint_interfaces == frozenset()


def test_reverse_path_program_left_by_an_earlier_agent_is_removed_after_in_sync():
    m, fake, _ = setup(hep_program=HEP)
    fake.ensure_clsact(2)
    fake.replace_filter(2, "ingress", 99, filter_name("calico_from_hep", 400))
    m.apply()  # not in sync: the datastore may still name eth0 a host endpoint
    assert ours(fake, "eth0")["ingress"] == [filter_name("calico_from_hep", 400)]
    m.on_update(p.InSync())
    m.apply()
    assert ours(fake, "eth0")["ingress"] == []


HOST = ProgramRef(fd=105, prog_id=505, name="calico_from_host")
NODEPORT = p.ServiceFrontendUpdate(id="0.0.0.0:30080/6", service="default/web", port_name="",
                                   vip="0.0.0.0", port=30080, protocol=6, kind="nodeport")
CLUSTER = p.ServiceFrontendUpdate(id="10.96.0.10:80/6", service="default/web", port_name="",
                                  vip="10.96.0.10", port=80, protocol=6)


def test_nodeport_program_on_data_interfaces_only_while_nodeports_exist():
    m, fake, _ = setup(hep_program=HEP, host_program=HOST)
    fake.add_link("eth1", 3)
    fake.add_link("tunl0", 4)
    m.on_update(p.InSync())
    m.on_update(CLUSTER)  # a ClusterIP alone: host interfaces stay without a program
    m.apply()
    assert not fake.links["eth0"].clsact and not fake.links["eth1"].clsact
    m.on_update(NODEPORT)
    m.on_update(p.HostEndpointUpdate(p.HostEndpointID("node1-eth1"),
                                     p.HostEndpoint("eth1", profile_ids=("open",))))
    m.apply()
    assert ours(fake, "eth0")["ingress"] == [filter_name("calico_from_host", 505)]
    assert ours(fake, "eth1")["ingress"] == [filter_name("calico_from_hep", 504)]  # RPF too
    assert not fake.links["tunl0"].clsact and not fake.links["lo"].clsact
    assert ours(fake, "cali1") == CURRENT
    assert m.nodeport_interfaces == {2} and m.host_endpoint_interfaces == {3}
    before = fake.mutations
    m.apply()
    assert fake.mutations == before
    m.on_update(p.ServiceFrontendRemove(NODEPORT.id))
    m.apply()
    assert ours(fake, "eth0")["ingress"] == []
    assert ours(fake, "eth1")["ingress"] == [filter_name("calico_from_hep", 504)]
    assert m.nodeport_interfaces == frozenset()


# --- XDP modes (XDPEnabled / GenericXDPEnabled) ---------------------------------------------

UNTRACKED_ETH0 = p.HostEndpointUpdate(p.HostEndpointID("node1-eth0"), p.HostEndpoint(
    "eth0", untracked_tiers=(p.TierInfo("default", ingress_policies=("x",)),)))


def test_xdp_native_where_the_driver_has_it():
    m, fake, _ = setup()
    m.on_update(p.InSync())
    m.on_update(UNTRACKED_ETH0)
    m.apply()
    assert (fake.links["eth0"].xdp_prog_id, fake.links["eth0"].xdp_mode) == (503, "native")


def test_xdp_generic_only_when_allowed(caplog):
    m, fake, _ = setup(xdp_modes=("native", "generic"))
    fake.links["eth0"].xdp_modes_supported = ("generic",)  # e.g. a bridge device
    m.on_update(p.InSync())
    m.on_update(UNTRACKED_ETH0)
    m.apply()
    assert (fake.links["eth0"].xdp_prog_id, fake.links["eth0"].xdp_mode) == (503, "generic")

    m, fake, _ = setup(xdp_modes=("native",))  # GenericXDPEnabled false (Felix's default)
    fake.links["eth0"].xdp_modes_supported = ("generic",)
    m.on_update(p.InSync())
    m.on_update(UNTRACKED_ETH0)
    with caplog.at_level(logging.WARNING, logger="pyfelix.agent.dataplane.managers.bpf_attach"):
        m.apply()  # not an error: iptables' raw chains enforce the untracked policy
    assert fake.links["eth0"].xdp_prog_id == 0
    assert "GenericXDPEnabled is false" in caplog.text
    before = fake.mutations
    m.apply()
    assert fake.mutations == before  # not retried every round (a resync retries)


def test_stale_xdp_of_ours_is_replaced_in_its_own_mode():
    m, fake, _ = setup()
    fake.programs[400] = "calico_xdp"  # an earlier build, attached generic (old agents did)
    fake.links["eth0"].xdp_prog_id, fake.links["eth0"].xdp_mode = 400, "generic"
    m.on_update(p.InSync())
    m.on_update(UNTRACKED_ETH0)
    m.apply()
    assert (fake.links["eth0"].xdp_prog_id, fake.links["eth0"].xdp_mode) == (503, "generic")


def test_xdp_disabled_attaches_none_and_removes_ours():
    fake = FakeAttacher()
    fake.programs = {400: "calico_xdp"}
    fake.add_link("eth0", 2)
    fake.links["eth0"].xdp_prog_id, fake.links["eth0"].xdp_mode = 400, "native"
    m = BpfAttachManager({"ingress": FROM, "egress": TO}, None, attacher=fake)  # XDPEnabled off
    m.on_update(p.InSync())
    m.on_update(UNTRACKED_ETH0)
    m.apply()
    assert fake.links["eth0"].xdp_prog_id == 0
