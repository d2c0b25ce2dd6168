"""The interfaces of the agent's namespace, as the BPF managers need them: name -> ifindex
(and each interface's addresses), from the interface monitor's messages, re-seeded from a
netlink dump when a manager reads the kernel (first apply, resync).

Why the dump: the driver loop applies as soon as the datastore is in sync, which can be
before the interface monitor's first report has been processed. A restarted agent must not
conclude "no interfaces" and delete the endpoint entries the still-attached programs use:
so the first apply lists the links itself. Later messages refine the table.

Inputs: `InterfaceUpdate` / `InterfaceAddrsUpdate` (`observe()` returns True when the
table changed), `replace_all(links, addrs)` from a dump. Output: `index_by_name`,
`addrs_by_name`. Invariant: an interface reported absent is gone from both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pyfelix.agent.dataplane.events import IFACE_ABSENT, InterfaceAddrsUpdate, InterfaceUpdate

# a dump: ({name: ifindex}, {name: addresses as CIDR strings})
InterfaceDump = tuple[dict[str, int], dict[str, frozenset[str]]]
Lister = Callable[[], InterfaceDump]


class InterfaceTable:
    def __init__(self) -> None:
        self.index_by_name: dict[str, int] = {}
        self.addrs_by_name: dict[str, frozenset[str]] = {}

    def observe(self, msg: object) -> bool:
        """Fold one interface message in; True if the table changed."""
        if isinstance(msg, InterfaceUpdate):
            if msg.state == IFACE_ABSENT:
                if self.index_by_name.get(msg.name) == msg.index:
                    del self.index_by_name[msg.name]
                    self.addrs_by_name.pop(msg.name, None)
                    return True
                return False
            if self.index_by_name.get(msg.name) != msg.index:
                self.index_by_name[msg.name] = msg.index
                return True
            return False
        if isinstance(msg, InterfaceAddrsUpdate):
            addrs = msg.addrs if msg.addrs is not None else frozenset()
            if msg.addrs is None:
                changed = msg.name in self.addrs_by_name
                self.addrs_by_name.pop(msg.name, None)
                return changed
            if self.addrs_by_name.get(msg.name) != addrs:
                self.addrs_by_name[msg.name] = addrs
                return True
        return False

    def replace_all(self, dump: InterfaceDump) -> None:
        links, addrs = dump
        self.index_by_name = dict(links)
        self.addrs_by_name = {name: frozenset(a) for name, a in addrs.items() if name in links}

    def matching(self, prefixes: Iterable[str]) -> dict[str, int]:
        """Interfaces whose name starts with one of the prefixes."""
        pre = tuple(prefixes)
        return {n: i for n, i in self.index_by_name.items() if n.startswith(pre)}
