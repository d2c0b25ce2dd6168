"""InterfaceMonitor on FakeNetlink: events become interface messages; resync repairs drift."""

from __future__ import annotations

from pyfelix.agent.dataplane.events import InterfaceAddrsUpdate, InterfaceUpdate
from pyfelix.agent.dataplane.ifacemonitor import InterfaceMonitor
from tests.fakes.clock import FakeClock
from tests.fakes.netlink import FakeNetlink


def _monitor(nl: FakeNetlink, out: list, clock: FakeClock | None = None) -> InterfaceMonitor:
    return InterfaceMonitor(out.append, netlink=nl, events=nl.events(),
                            clock=clock or FakeClock(), resync_interval=60.0)


def test_initial_resync_reports_every_interface_with_addresses() -> None:
    nl = FakeNetlink()
    nl.add_link("lo")
    nl.add_link("cali1", up=False)
    nl.add_addr("lo", "127.0.0.1/8")
    out: list = []
    mon = _monitor(nl, out)
    mon.poll_once(0)
    lo, cali = nl.link_by_name("lo"), nl.link_by_name("cali1")
    assert out == [
        InterfaceUpdate("lo", lo.index, "up"),
        InterfaceAddrsUpdate("lo", frozenset({"127.0.0.1/8"})),
        InterfaceUpdate("cali1", cali.index, "down"),
        InterfaceAddrsUpdate("cali1", frozenset()),
    ]


def test_events_become_changes_only() -> None:
    nl = FakeNetlink()
    out: list = []
    mon = _monitor(nl, out)
    mon.poll_once(0)
    assert out == []
    link = nl.add_link("cali1", up=False)
    nl.set_link_up("cali1", True)
    nl.set_link_up("cali1", True)  # no change: no message
    nl.add_addr("cali1", "10.0.0.1/24")
    nl.remove_addr("cali1", "10.0.0.1/24")
    nl.remove_link("cali1")
    mon.poll_once(0)
    assert out == [
        InterfaceUpdate("cali1", link.index, "down"),
        InterfaceAddrsUpdate("cali1", frozenset()),
        InterfaceUpdate("cali1", link.index, "up"),
        InterfaceAddrsUpdate("cali1", frozenset({"10.0.0.1/24"})),
        InterfaceAddrsUpdate("cali1", frozenset()),
        InterfaceAddrsUpdate("cali1", None),
        InterfaceUpdate("cali1", link.index, "absent"),
    ]


def test_rename_reports_old_name_absent() -> None:
    from pyfelix.agent.shims.netlink import Link, LinkEvent

    nl = FakeNetlink()
    out: list = []
    mon = _monitor(nl, out)
    mon.handle_events([LinkEvent(Link(7, "tmp123", True, True), removed=False)])
    mon.handle_events([LinkEvent(Link(7, "cali9", True, True), removed=False)])
    assert InterfaceUpdate("tmp123", 7, "absent") in out
    assert out[-2:] == [
        InterfaceUpdate("cali9", 7, "up"),
        InterfaceAddrsUpdate("cali9", frozenset()),
    ]


def test_lost_events_repaired_by_overflow_resync_and_periodic_resync() -> None:
    nl = FakeNetlink()
    out: list = []
    clock = FakeClock()
    events = nl.events()
    mon = InterfaceMonitor(out.append, netlink=nl, events=events, clock=clock,
                           resync_interval=60.0)
    mon.poll_once(0)
    link = nl.add_link("cali1")
    events.overflow_next = True  # the kernel dropped the NEWLINK
    mon.poll_once(0)
    assert InterfaceUpdate("cali1", link.index, "up") in out
    out.clear()
    # silently lose an event, then let the periodic resync notice
    nl.links[link.index] = link.__class__(link.index, "cali1", admin_up=False, lower_up=False)
    mon.poll_once(0)
    assert out == []
    clock.advance(60.0)
    mon.poll_once(0)
    assert out == [InterfaceUpdate("cali1", link.index, "down")]
    assert mon.resyncs == 3
