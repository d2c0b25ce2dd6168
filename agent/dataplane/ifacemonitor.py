"""Interface monitor: netlink link/address events of one namespace -> interface messages.

Role: Felix's `ifacemonitor`. A thread listens on an rtnetlink event socket (link and IPv4/IPv6
address groups) in the dataplane's namespace and reports, through `callback` (normally the
driver loop's `enqueue`):
- `InterfaceUpdate(name, index, state)` when an interface appears, changes up/down state
  (up = admin up AND carrier), is renamed (old name reported absent) or disappears;
- `InterfaceAddrsUpdate(name, addrs)` when its set of addresses changes (None when gone).

Resync: at start and every `resync_interval` seconds (and when the kernel reports that events
were dropped, ENOBUFS) the monitor dumps all links and addresses and reports the difference
from what it had reported, so missed events are repaired.

Liveness: `heartbeat` (optional, no arguments) is called from the monitor thread after every
poll (at most `poll_interval` s apart while netlink answers); the agent reports the
`iface-monitor` health reporter from it (`agent.health`).

Invariants: only changes are reported (the same state twice produces one message); the
event socket is opened BEFORE the first dump, so nothing between the two is lost (events
replayed after the dump can briefly report an older state, then converge). The callback is
called from the monitor thread only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from pyfelix.agent.dataplane.events import (
    IFACE_ABSENT,
    IFACE_DOWN,
    IFACE_UP,
    InterfaceAddrsUpdate,
    InterfaceUpdate,
)
from pyfelix.agent.shims.clock import Clock, SystemClock
from pyfelix.agent.shims.netlink import (
    Address,
    AddrEvent,
    EventsOverflow,
    Link,
    LinkEvent,
    Netlink,
    NetlinkEvent,
    NetlinkEvents,
)

log = logging.getLogger(__name__)


class InterfaceMonitor:
    """Reports interface state changes of one namespace to `callback`."""

    def __init__(
        self,
        callback: Callable[[object], None],
        *,
        netns: str | None = None,
        netlink: Netlink | None = None,
        events: NetlinkEvents | None = None,
        clock: Clock | None = None,
        resync_interval: float = 90.0,
        poll_interval: float = 0.5,
        heartbeat: Callable[[], None] | None = None,
    ) -> None:
        self._callback = callback
        self._heartbeat = heartbeat
        self._netns = netns
        self._netlink = netlink
        self._events = events
        self._clock = clock or SystemClock()
        self._resync_interval = resync_interval
        self._poll_interval = poll_interval
        self._links: dict[int, Link] = {}  # what we reported, by ifindex
        self._addrs: dict[int, frozenset[str]] = {}  # by ifindex; reported when link known
        self._next_resync_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.resyncs = 0

    # --- shims (created in the thread that uses them) --------------------------------------

    def _ensure_shims(self) -> None:
        if self._events is None:
            from pyfelix.agent.shims.netlink import PyRoute2Events

            self._events = PyRoute2Events(self._netns)
        if self._netlink is None:
            from pyfelix.agent.shims.netlink import PyRoute2Netlink

            self._netlink = PyRoute2Netlink(self._netns)

    # --- full dump -------------------------------------------------------------------------

    def resync(self) -> None:
        """Dump every link and address; report whatever differs from what we reported."""
        self._ensure_shims()
        assert self._netlink is not None
        links = {link.index: link for link in self._netlink.list_links()}
        addrs: dict[int, set[str]] = {index: set() for index in links}
        for addr in self._netlink.list_addrs():
            addrs.setdefault(addr.ifindex, set()).add(addr.cidr)
        for index in sorted(set(self._links) - set(links)):
            self._link_removed(index)
        for index in sorted(links):
            if index not in self._links:  # new: its first report carries the dumped addresses
                self._addrs[index] = frozenset(addrs.get(index, ()))
            self._link_seen(links[index])
            self._set_addrs(index, frozenset(addrs.get(index, ())))
        for index in set(self._addrs) - set(links):
            del self._addrs[index]
        self.resyncs += 1
        self._next_resync_at = self._clock.monotonic() + self._resync_interval

    # --- events ----------------------------------------------------------------------------

    def handle_events(self, events: Iterable[NetlinkEvent]) -> None:
        for event in events:
            if isinstance(event, LinkEvent):
                if event.removed:
                    self._link_removed(event.link.index)
                else:
                    self._link_seen(event.link)
            elif isinstance(event, AddrEvent):
                self._addr_event(event.addr, event.removed)

    def poll_once(self, timeout: float) -> None:
        """Wait up to `timeout` s for events, report them; resync when due or events were lost."""
        self._ensure_shims()
        assert self._events is not None
        if self._next_resync_at is None:
            self.resync()
        try:
            self.handle_events(self._events.poll(timeout))
        except EventsOverflow:
            log.warning("interface monitor lost netlink events; resyncing")
            self.resync()
            return
        if self._next_resync_at is not None and self._clock.monotonic() >= self._next_resync_at:
            self.resync()

    # --- thread ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("InterfaceMonitor already started")
        self._thread = threading.Thread(target=self._run, name="iface-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._events is not None:
            self._events.close()
        if self._netlink is not None:
            self._netlink.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once(self._poll_interval)
            except Exception:
                log.exception("interface monitor failed; resyncing after a pause")
                self._next_resync_at = None
                self._stop.wait(1.0)
            if self._heartbeat is not None:
                try:
                    self._heartbeat()
                except Exception:
                    log.exception("interface monitor heartbeat failed")

    # --- state changes ---------------------------------------------------------------------

    @staticmethod
    def _state(link: Link) -> str:
        return IFACE_UP if link.up else IFACE_DOWN

    def _link_seen(self, link: Link) -> None:
        old = self._links.get(link.index)
        if old is not None and old.name != link.name:
            self._report_gone(old)  # a rename: the old name is gone
            old = None
        self._links[link.index] = link
        if old is None or self._state(old) != self._state(link):
            self._callback(InterfaceUpdate(link.name, link.index, self._state(link)))
        if old is None:
            addrs = self._addrs.setdefault(link.index, frozenset())
            self._callback(InterfaceAddrsUpdate(link.name, addrs))

    def _link_removed(self, index: int) -> None:
        old = self._links.pop(index, None)
        self._addrs.pop(index, None)
        if old is not None:
            self._report_gone(old)

    def _report_gone(self, link: Link) -> None:
        self._callback(InterfaceAddrsUpdate(link.name, None))
        self._callback(InterfaceUpdate(link.name, link.index, IFACE_ABSENT))

    def _addr_event(self, addr: Address, removed: bool) -> None:
        current = set(self._addrs.get(addr.ifindex, frozenset()))
        if removed:
            current.discard(addr.cidr)
        else:
            current.add(addr.cidr)
        self._set_addrs(addr.ifindex, frozenset(current))

    def _set_addrs(self, index: int, addrs: frozenset[str]) -> None:
        if index in self._addrs and self._addrs[index] == addrs:
            return
        self._addrs[index] = addrs
        link = self._links.get(index)
        if link is not None:
            self._callback(InterfaceAddrsUpdate(link.name, addrs))
