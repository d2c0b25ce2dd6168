"""BpfGuardManager on a fake guard: the set follows the attach manager's outcome, only adds
what is attached, only removes what is gone, and never shrinks on a restart."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyfelix.agent.dataplane.managers.bpf_guard import BpfGuardManager
from pyfelix.agent.shims.nft_guard import install_script


@dataclass
class FakeAttach:
    attached: frozenset[int] = frozenset()
    links: dict[str, int] = field(default_factory=dict)
    links_listed: bool = True


@dataclass
class FakeGuard:
    """The kernel side: a set that survives managers (like the nft table survives agents)."""

    members_: set[int] = field(default_factory=set)
    installs: list[tuple[str, ...]] = field(default_factory=list)
    writes: int = 0

    def install(self, prefixes):  # type: ignore[no-untyped-def]
        self.installs.append(tuple(prefixes))
        return True

    def members(self, names):  # type: ignore[no-untyped-def]
        return set(self.members_)

    def add(self, ifindexes):  # type: ignore[no-untyped-def]
        self.writes += 1
        self.members_ |= set(ifindexes)

    def discard(self, ifindexes):  # type: ignore[no-untyped-def]
        self.writes += 1
        self.members_ -= set(ifindexes)

    def counters(self):  # type: ignore[no-untyped-def]
        return {}


def test_set_follows_attached_interfaces_and_removes_only_gone_ones() -> None:
    attach = FakeAttach(links={"cali1": 5, "cali2": 6, "eth0": 2})
    guard = FakeGuard()
    mgr = BpfGuardManager(attach, interface_prefixes=("cali",), guard=guard)  # type: ignore[arg-type]
    mgr.apply()
    assert guard.installs == [("cali",)] and guard.members_ == set()
    attach.attached = frozenset({5})
    mgr.apply()
    assert guard.members_ == {5}
    writes = guard.writes
    mgr.apply()  # nothing changed: nothing written
    assert guard.writes == writes
    attach.attached = frozenset({5, 6})
    mgr.apply()
    assert guard.members_ == {5, 6}
    # cali1 goes away: its ifindex leaves the set
    attach.links = {"cali2": 6, "eth0": 2}
    attach.attached = frozenset({6})
    mgr.apply()
    assert guard.members_ == {6}


def test_a_restarted_manager_keeps_what_is_programmed_until_it_is_gone() -> None:
    guard = FakeGuard(members_={5, 6, 9})  # left by the previous agent; 9 is gone
    attach = FakeAttach(links={"cali1": 5, "cali2": 6})  # nothing re-attached yet
    mgr = BpfGuardManager(attach, guard=guard)  # type: ignore[arg-type]
    mgr.apply()
    assert guard.members_ == {5, 6}  # running interfaces stay reachable
    attach.attached = frozenset({5, 6})
    mgr.apply()
    assert guard.members_ == {5, 6}


def test_nothing_is_removed_before_the_interfaces_were_listed() -> None:
    guard = FakeGuard(members_={5, 6})
    attach = FakeAttach(links={}, links_listed=False)  # the attach manager's dump failed
    mgr = BpfGuardManager(attach, guard=guard)  # type: ignore[arg-type]
    mgr.apply()
    assert guard.members_ == {5, 6}
    attach.links, attach.links_listed = {"cali2": 6}, True
    mgr.apply()
    assert guard.members_ == {6}


def test_install_script_keeps_the_set_and_covers_every_prefix() -> None:
    script, tag = install_script(("cali", "tap"))
    assert "flush set" not in script and "delete" not in script
    for chain in ("forward", "input", "output"):
        assert f"flush chain inet pyfelix_guard {chain}" in script
    assert script.count('iifname "tap*" iif != @programmed') == 2
    assert script.count('oifname "cali*" oif != @programmed') == 2
    assert install_script(("cali", "tap"))[1] == tag != install_script(("cali",))[1]
