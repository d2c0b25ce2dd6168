"""BpfCtlbManager against a stateful fake of the cgroup attachments: it attaches what the
mode needs, only what is missing, replaces a previous build's programs, detaches ours the
mode does not need, and never touches other programs."""

from __future__ import annotations

import pytest

from pyfelix.agent.dataplane.managers.bpf_ctlb import (
    HOOKS,
    BpfCtlbManager,
    default_cgroup_root,
    parse_mode,
)

CONNECT = int(HOOKS["calico_connect4"])
SENDMSG = int(HOOKS["calico_sendmsg4"])


class FakeCgroups:
    def __init__(self) -> None:
        self.attached_progs: dict[int, list[tuple[int, str]]] = {}  # attach type -> progs
        self.writes: list[tuple[str, int, int]] = []
        self.names = {100 + i: name for i, name in enumerate(HOOKS)}  # fd -> name (ids = fd)

    def open_cgroup(self, path: str) -> int:
        assert path == "/cg/test"
        return 7

    def close(self, fd: int) -> None:
        assert fd == 7

    def attached(self, cgroup_fd: int, attach_type: int) -> list[tuple[int, str]]:
        return list(self.attached_progs.get(attach_type, []))

    def attach(self, cgroup_fd: int, prog_fd: int, attach_type: int) -> None:
        self.writes.append(("attach", prog_fd, attach_type))
        self.attached_progs[attach_type] = [(prog_fd, self.names[prog_fd])]  # override

    def detach(self, cgroup_fd: int, prog_id: int, attach_type: int) -> None:
        self.writes.append(("detach", prog_id, attach_type))
        self.attached_progs[attach_type] = [
            p for p in self.attached_progs[attach_type] if p[0] != prog_id]

    def prog_id(self, prog_fd: int) -> int:
        return prog_fd


def _manager(mode: str, shim: FakeCgroups) -> BpfCtlbManager:
    programs = {name: fd for fd, name in shim.names.items()}
    return BpfCtlbManager(programs, mode=mode, cgroup="/cg/test", shim=shim)


def test_tcp_mode_attaches_connect_and_getpeername_once() -> None:
    shim = FakeCgroups()
    manager = _manager("TCP", shim)
    manager.apply()
    assert sorted(w[2] for w in shim.writes) == sorted(
        [CONNECT, int(HOOKS["calico_getpeername4"])])
    shim.writes.clear()
    manager.apply()
    manager.request_resync()
    manager.apply()  # re-read: all in place, nothing written
    assert shim.writes == []


def test_a_previous_builds_program_is_replaced_and_others_left_alone() -> None:
    shim = FakeCgroups()
    shim.attached_progs[CONNECT] = [(55, "calico_connect4")]  # an older build's
    shim.attached_progs[SENDMSG] = [(66, "someone_else")]
    manager = _manager("TCP", shim)
    manager.apply()
    assert ("attach", 100, CONNECT) in shim.writes
    assert shim.attached_progs[SENDMSG] == [(66, "someone_else")]


def test_disabled_detaches_ours_only() -> None:
    shim = FakeCgroups()
    shim.attached_progs[CONNECT] = [(55, "calico_connect4"), (66, "someone_else")]
    _manager("Disabled", shim).apply()
    assert shim.writes == [("detach", 55, CONNECT)]
    assert shim.attached_progs[CONNECT] == [(66, "someone_else")]


def test_modes_and_cgroup_root(tmp_path) -> None:
    assert parse_mode("Enabled") == "enabled"
    with pytest.raises(ValueError, match="BPFConnectTimeLoadBalancing"):
        parse_mode("Sometimes")
    mounts = tmp_path / "mounts"
    mounts.write_text("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n"
                      "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    assert default_cgroup_root(str(mounts)) == "/sys/fs/cgroup/unified"
    mounts.write_text("proc /proc proc rw 0 0\n")
    assert default_cgroup_root(str(mounts)) == ""


def test_bpf_mode_off_detaches_every_program_of_ours() -> None:
    from pyfelix.agent.dataplane.managers.bpf_ctlb import detach_ctlb_programs

    shim = FakeCgroups()
    shim.attached_progs[CONNECT] = [(55, "calico_connect4"), (66, "someone_else")]
    shim.attached_progs[SENDMSG] = [(57, "calico_sendmsg4")]
    assert detach_ctlb_programs("/cg/test", shim) == 2
    assert shim.attached_progs == {CONNECT: [(66, "someone_else")], SENDMSG: []}
    assert detach_ctlb_programs("/cg/test", shim) == 0
