"""Stateful fakes for the BPF managers' unit tests: a set of FakeMaps shaped like the pinned
maps, and a FakeAttacher that keeps tc filters and XDP programs per interface."""

from __future__ import annotations

import errno
from dataclasses import dataclass, field

from pyfelix.agent.bpf.attach import AttachError, InterfaceGone, TcFilter
from pyfelix.agent.bpf.maps import ALL_MAPS
from pyfelix.agent.bpf.maps.base import FakeMap


def fake_maps(**sizes: int) -> dict[str, FakeMap]:
    """One FakeMap per pinned map, small by default; `sizes` overrides max_entries."""
    defaults = {"rules": 4096, "ipsets": 65536, "endpoints": 256, "ids": 8192,
                "rule_counters": 4096, "ep_counters": 256, "routes": 1024,
                "untracked": 1024, "conntrack": 4096}
    return {p.name: FakeMap(p, max_entries=sizes.get(p.name, defaults.get(p.name)))
            for p in ALL_MAPS}


def total_writes(maps: dict[str, FakeMap]) -> dict[str, int]:
    return {name: m.writes for name, m in maps.items()}


@dataclass
class FakeInterface:
    ifindex: int
    clsact: bool = False
    filters: dict[str, list[TcFilter]] = field(
        default_factory=lambda: {"ingress": [], "egress": []})
    fds: dict[tuple[str, int, int], int] = field(default_factory=dict)  # -> prog fd
    xdp_prog_id: int = 0
    xdp_mode: str = ""
    xdp_modes_supported: tuple[str, ...] = ("native", "generic")  # the driver's


class FakeAttacher:
    """Interfaces by name; `programs` maps a prog id to its kernel name (for XDP checks).
    `mutations` counts every change made; `fail_next` raises once from the next call."""

    def __init__(self) -> None:
        self.links: dict[str, FakeInterface] = {}
        self.programs: dict[int, str] = {}
        self.xdp_fds: dict[int, int] = {}  # fd -> prog id, for set_xdp
        self.mutations = 0
        self.fail_next: Exception | None = None
        self.closed = False

    # test helpers
    def add_link(self, name: str, ifindex: int) -> FakeInterface:
        self.links[name] = FakeInterface(ifindex)
        return self.links[name]

    def remove_link(self, name: str) -> None:
        del self.links[name]

    def by_index(self, ifindex: int) -> FakeInterface:
        for iface in self.links.values():
            if iface.ifindex == ifindex:
                return iface
        raise InterfaceGone(f"ifindex {ifindex}: interface gone")

    def _maybe_fail(self) -> None:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc

    # Attacher protocol
    def list_links(self) -> dict[str, int]:
        self._maybe_fail()
        return {n: i.ifindex for n, i in self.links.items()}

    def ensure_clsact(self, ifindex: int) -> None:
        self._maybe_fail()
        iface = self.by_index(ifindex)
        if not iface.clsact:
            iface.clsact = True
            self.mutations += 1

    def list_filters(self, ifindex: int, hook: str) -> list[TcFilter]:
        self._maybe_fail()
        return list(self.by_index(ifindex).filters[hook])

    def replace_filter(self, ifindex: int, hook: str, fd: int, name: str) -> None:
        self._maybe_fail()
        iface = self.by_index(ifindex)
        if not iface.clsact:
            raise AttachError(f"ifindex {ifindex}: no clsact qdisc (errno {errno.EINVAL})")
        kept = [f for f in iface.filters[hook] if (f.prio, f.handle) != (1, 1)]
        iface.filters[hook] = [*kept, TcFilter(1, 1, "bpf", name)]
        iface.fds[(hook, 1, 1)] = fd
        self.mutations += 1

    def delete_filter(self, ifindex: int, hook: str, prio: int, handle: int) -> None:
        self._maybe_fail()
        iface = self.by_index(ifindex)
        iface.filters[hook] = [f for f in iface.filters[hook]
                               if (f.prio, f.handle) != (prio, handle)]
        self.mutations += 1

    def xdp_prog_id(self, ifindex: int) -> int:
        self._maybe_fail()
        return self.by_index(ifindex).xdp_prog_id

    def xdp_mode(self, ifindex: int) -> str:
        iface = self.by_index(ifindex)
        return iface.xdp_mode if iface.xdp_prog_id else ""

    def set_xdp(self, ifindex: int, fd: int, mode: str = "generic") -> None:
        self._maybe_fail()
        iface = self.by_index(ifindex)
        if mode not in iface.xdp_modes_supported:
            raise AttachError(f"attaching calico_xdp ({mode}) on ifindex {ifindex}: "
                              "Operation not supported")
        iface.xdp_prog_id = self.xdp_fds[fd]
        iface.xdp_mode = mode
        self.mutations += 1

    def clear_xdp(self, ifindex: int) -> None:
        self._maybe_fail()
        self.by_index(ifindex).xdp_prog_id = 0
        self.mutations += 1

    def prog_name(self, prog_id: int) -> str | None:
        return self.programs.get(prog_id)

    def close(self) -> None:
        self.closed = True
