"""BpfCtlbManager: keeps the connect-time load balancer (bpf/ctlb.c) attached to a cgroup v2
directory, so host-networked clients reach Services in BPF mode.

Inputs (construction): Felix's BPFConnectTimeLoadBalancing (`TCP`: connect() of TCP
sockets; `Enabled`: TCP and UDP, connected or not; `Disabled`: nothing), the cgroup v2
directory (BPFCgroupV2; empty: the root of the first cgroup2 mount, as Felix attaches at its
own cgroup2 mount's root, so every process of the node is covered), and the loaded build's
programs (name -> fd). Messages: none (`on_update` ignores everything).
Output (kernel): for each hook the mode needs, this build's program attached to the cgroup
for that attach type (BPF_F_ALLOW_OVERRIDE: attaching replaces a previous build's in one
step, so there is no moment without a translator); hooks the mode does not need carry none
of ours (programs named calico_* are detached; others' programs are left alone).

Invariants: apply() reads what is attached (BPF_PROG_QUERY) before writing, and writes only
the difference; a missing cgroup directory or a refused attach raises (the loop retries and
counts it). Not policy-critical: without it, host-networked clients reach no Service (as
without kube-proxy), but no packet passes unpoliced.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from pyfelix.agent.bpf import syscall
from pyfelix.agent.bpf.loader import CTLB_PROGRAMS
from pyfelix.agent.dataplane.manager import ManagerBase

log = logging.getLogger(__name__)

HOOKS = CTLB_PROGRAMS  # program name -> the cgroup hook it is loaded for
MODE_PROGRAMS: dict[str, tuple[str, ...]] = {
    "disabled": (),
    "tcp": ("calico_connect4", "calico_getpeername4"),
    "enabled": tuple(HOOKS),
}
OUR_PREFIX = "calico_"  # the kernel keeps the first 15 bytes of a program's name


class CgroupShim(Protocol):
    """Kernel access: what is attached, attach, detach (fds of the cgroup and programs)."""

    def open_cgroup(self, path: str) -> int: ...

    def close(self, fd: int) -> None: ...

    def attached(self, cgroup_fd: int, attach_type: int) -> list[tuple[int, str]]: ...

    def attach(self, cgroup_fd: int, prog_fd: int, attach_type: int) -> None: ...

    def detach(self, cgroup_fd: int, prog_id: int, attach_type: int) -> None: ...

    def prog_id(self, prog_fd: int) -> int: ...


class KernelCgroups:
    """The real shim (bpf syscalls on a cgroup v2 directory fd)."""

    def open_cgroup(self, path: str) -> int:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self, fd: int) -> None:
        os.close(fd)

    def attached(self, cgroup_fd: int, attach_type: int) -> list[tuple[int, str]]:
        out = []
        for prog_id in syscall.cgroup_query(cgroup_fd, attach_type):
            info = syscall.prog_info_by_id(prog_id)
            if info is not None:
                out.append((prog_id, info.name))
        return out

    def attach(self, cgroup_fd: int, prog_fd: int, attach_type: int) -> None:
        syscall.cgroup_attach(cgroup_fd, prog_fd, attach_type)

    def detach(self, cgroup_fd: int, prog_id: int, attach_type: int) -> None:
        fd = syscall.prog_fd_by_id(prog_id)
        if fd is None:
            return  # unloaded meanwhile: detached with it
        try:
            syscall.cgroup_detach(cgroup_fd, fd, attach_type)
        finally:
            os.close(fd)

    def prog_id(self, prog_fd: int) -> int:
        return syscall.prog_info(prog_fd).prog_id


def default_cgroup_root(mounts: str = "/proc/self/mounts") -> str:
    """The mount point of the first cgroup2 filesystem, or "" when there is none."""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return fields[1]
    return ""


def parse_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in MODE_PROGRAMS:
        raise ValueError(f"BPFConnectTimeLoadBalancing: {text!r} is not one of TCP, Enabled, "
                         "Disabled")
    return mode


class BpfCtlbManager(ManagerBase):
    name = "bpf-ctlb"
    policy_critical = False

    def __init__(self, programs: Mapping[str, int], *, mode: str, cgroup: str,
                 shim: CgroupShim | None = None) -> None:
        super().__init__()
        self.mode = parse_mode(mode)
        self.cgroup = cgroup or default_cgroup_root()
        self.programs = {name: programs[name] for name in HOOKS if name in programs}
        self.shim = shim or KernelCgroups()
        self._prog_ids: dict[str, int] = {}
        self._done = False

    def on_update(self, msg: object) -> None:
        return None

    def request_resync(self) -> None:
        super().request_resync()
        self._done = False

    def apply(self) -> None:
        if self._done:
            return
        wanted = MODE_PROGRAMS[self.mode]
        if not wanted and not self.cgroup:
            self._done = True
            return
        if not self.cgroup:
            raise RuntimeError("BPFConnectTimeLoadBalancing needs a cgroup v2 directory: "
                               "none is mounted and BPFCgroupV2 is not set")
        fd = self.shim.open_cgroup(self.cgroup)
        try:
            for name, attach_type in HOOKS.items():
                present = self.shim.attached(fd, int(attach_type))
                if name in wanted:
                    ours = self._prog_id(name)
                    if not any(prog_id == ours for prog_id, _ in present):
                        self.shim.attach(fd, self.programs[name], int(attach_type))
                        log.info("BPF: %s attached to cgroup %s", name, self.cgroup)
                else:
                    for prog_id, prog_name in present:
                        if prog_name.startswith(OUR_PREFIX):
                            self.shim.detach(fd, prog_id, int(attach_type))
                            log.info("BPF: %s (id %d) detached from cgroup %s", prog_name,
                                     prog_id, self.cgroup)
        finally:
            self.shim.close(fd)
        self._done = True

    def _prog_id(self, name: str) -> int:
        if name not in self._prog_ids:
            self._prog_ids[name] = self.shim.prog_id(self.programs[name])
        return self._prog_ids[name]


def detach_ctlb_programs(cgroup: str, shim: CgroupShim | None = None) -> int:
    """BPF mode off (managers/bpf_cleanup.py): detach every program of ours from the cgroup
    (empty: the first cgroup2 mount's root). Returns how many were detached; raises OSError
    when the cgroup cannot be read."""
    path = cgroup or default_cgroup_root()
    if not path:
        return 0
    shim = shim or KernelCgroups()
    fd = shim.open_cgroup(path)
    removed = 0
    try:
        for attach_type in HOOKS.values():
            for prog_id, name in shim.attached(fd, int(attach_type)):
                if name.startswith(OUR_PREFIX):
                    shim.detach(fd, prog_id, int(attach_type))
                    removed += 1
    finally:
        shim.close(fd)
    return removed
