"""Attaching the programs to interfaces: tc clsact filters and XDP, through netlink (pyroute2).

Role: the narrow kernel shim the attach manager drives (`Attacher`), with the real
implementation `PyRoute2Attacher` for one network namespace (None: the caller's own; the
agent runs inside its node's namespace). A stateful fake lives with the tests.

What "ours" means (never touch anything else):
- tc: a `bpf` filter under the clsact qdisc's ingress (`ffff:fff2`) or egress (`ffff:fff3`)
  parent whose name starts with `FILTER_NAME_PREFIX`. We attach at `TC_PRIO` / `TC_HANDLE`,
  naming the filter `pyfelix:<program>:<program id>`: the kernel gives every loaded program
  a new id, so after an agent restart (a new build) the name tells a stale filter from the
  current one and the manager replaces it (`tc filter replace`, atomic: traffic never sees
  a missing program).
- XDP: the program attached to the link (IFLA_XDP_PROG_ID) is ours when the kernel names it
  `calico_xdp` (our program's name). `set_xdp` attaches in the mode asked for: "native"
  (the driver's own hook, XDP_FLAGS_DRV_MODE: veth, most NICs) or "generic" (skb mode,
  XDP_FLAGS_SKB_MODE, every driver); the manager picks (XDPEnabled / GenericXDPEnabled).
  `xdp_mode` reads which one is attached (IFLA_XDP_ATTACHED) so a program is replaced, or
  detached, in the mode it has: the kernel keeps native and generic apart.

Errors: an interface that vanished raises `InterfaceGone` (the manager forgets it); other
netlink failures raise `AttachError` naming the interface and hook.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any, Protocol

from pyfelix.agent.bpf import syscall

HOOK_PARENTS = {"ingress": "ffff:fff2", "egress": "ffff:fff3"}
TC_PRIO = 1
TC_HANDLE = 1
FILTER_NAME_PREFIX = "pyfelix:"
XDP_PROG_NAME = "calico_xdp"
XDP_FLAGS_SKB_MODE = 1 << 1
XDP_FLAGS_DRV_MODE = 1 << 2
XDP_MODE_FLAGS = {"generic": XDP_FLAGS_SKB_MODE, "native": XDP_FLAGS_DRV_MODE}
# IFLA_XDP_ATTACHED values (XDP_ATTACHED_*), as numbers or as pyroute2 names them
_ATTACHED_MODES: dict[object, str] = {1: "native", 2: "generic", "xdp": "native",
                                      "xdpgeneric": "generic"}


class AttachError(RuntimeError):
    """Attaching or inspecting programs on an interface failed (message names it)."""


class InterfaceGone(AttachError):
    """The interface no longer exists."""


@dataclass(frozen=True)
class TcFilter:
    """One tc filter as the kernel lists it."""

    prio: int
    handle: int
    kind: str
    name: str

    @property
    def ours(self) -> bool:
        return self.kind == "bpf" and self.name.startswith(FILTER_NAME_PREFIX)


def filter_name(prog_name: str, prog_id: int) -> str:
    return f"{FILTER_NAME_PREFIX}{prog_name}:{prog_id}"


class Attacher(Protocol):
    def list_links(self) -> dict[str, int]: ...

    def ensure_clsact(self, ifindex: int) -> None: ...

    def list_filters(self, ifindex: int, hook: str) -> list[TcFilter]: ...

    def replace_filter(self, ifindex: int, hook: str, fd: int, name: str) -> None: ...

    def delete_filter(self, ifindex: int, hook: str, prio: int, handle: int) -> None: ...

    def xdp_prog_id(self, ifindex: int) -> int: ...

    def xdp_mode(self, ifindex: int) -> str: ...

    def set_xdp(self, ifindex: int, fd: int, mode: str = "generic") -> None: ...

    def clear_xdp(self, ifindex: int) -> None: ...

    def prog_name(self, prog_id: int) -> str | None: ...

    def close(self) -> None: ...


def _failed(what: str, ifindex: int, exc: Exception) -> AttachError:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None)
    if code in (errno.ENODEV, errno.ENXIO):
        return InterfaceGone(f"{what} on ifindex {ifindex}: interface gone")
    return AttachError(f"{what} on ifindex {ifindex}: {exc}")


class PyRoute2Attacher:
    """The real thing: pyroute2 IPRoute in `netns` (a name under /run/netns, or None)."""

    def __init__(self, netns: str | None = None) -> None:
        from pyroute2 import IPRoute

        self._ipr: Any = IPRoute(netns=f"/run/netns/{netns}", flags=0) if netns else IPRoute()

    def close(self) -> None:
        self._ipr.close()

    def list_links(self) -> dict[str, int]:
        return {str(m.get_attr("IFLA_IFNAME")): int(m["index"]) for m in self._ipr.get_links()}

    def ensure_clsact(self, ifindex: int) -> None:
        try:
            self._ipr.tc("add", "clsact", ifindex)
        except Exception as exc:
            if getattr(exc, "code", None) == errno.EEXIST:
                return
            raise _failed("adding the clsact qdisc", ifindex, exc) from exc

    def list_filters(self, ifindex: int, hook: str) -> list[TcFilter]:
        try:
            msgs = self._ipr.get_filters(index=ifindex, parent=HOOK_PARENTS[hook])
        except Exception as exc:
            code = getattr(exc, "code", None)
            if code == errno.EINVAL:  # no clsact qdisc yet: no filters
                return []
            raise _failed(f"listing {hook} filters", ifindex, exc) from exc
        out = []
        for m in msgs:
            if not m["handle"]:
                continue  # the per-priority chain head, not a filter
            options = m.get_attr("TCA_OPTIONS")
            name = (options.get_attr("TCA_BPF_NAME") if options is not None else None) or ""
            out.append(TcFilter(prio=(int(m["info"]) >> 16) & 0xFFFF, handle=int(m["handle"]),
                                kind=str(m.get_attr("TCA_KIND") or ""), name=str(name)))
        return out

    def replace_filter(self, ifindex: int, hook: str, fd: int, name: str) -> None:
        try:
            self._ipr.tc("replace-filter", "bpf", ifindex, TC_HANDLE, fd=fd, name=name,
                         parent=HOOK_PARENTS[hook], classid=1, direct_action=True,
                         prio=TC_PRIO)
        except Exception as exc:
            raise _failed(f"attaching {name} at tc {hook}", ifindex, exc) from exc

    def delete_filter(self, ifindex: int, hook: str, prio: int, handle: int) -> None:
        try:
            self._ipr.tc("del-filter", "bpf", ifindex, handle, parent=HOOK_PARENTS[hook],
                         prio=prio)
        except Exception as exc:
            if getattr(exc, "code", None) == errno.ENOENT:
                return
            raise _failed(f"deleting a tc {hook} filter", ifindex, exc) from exc

    def xdp_prog_id(self, ifindex: int) -> int:
        try:
            links = self._ipr.get_links(ifindex)
        except Exception as exc:
            raise _failed("reading XDP state", ifindex, exc) from exc
        xdp = links[0].get_attr("IFLA_XDP") if links else None
        if xdp is None:
            return 0
        return int(xdp.get_attr("IFLA_XDP_PROG_ID") or 0)

    def xdp_mode(self, ifindex: int) -> str:
        """"native", "generic", or "" (nothing attached, or offloaded/several)."""
        try:
            links = self._ipr.get_links(ifindex)
        except Exception as exc:
            raise _failed("reading XDP state", ifindex, exc) from exc
        xdp = links[0].get_attr("IFLA_XDP") if links else None
        if xdp is None:
            return ""
        return _ATTACHED_MODES.get(xdp.get_attr("IFLA_XDP_ATTACHED"), "")

    def set_xdp(self, ifindex: int, fd: int, mode: str = "generic") -> None:
        self._set_xdp(ifindex, fd, XDP_MODE_FLAGS[mode], f"attaching calico_xdp ({mode})")

    def clear_xdp(self, ifindex: int) -> None:
        mode = self.xdp_mode(ifindex) or "generic"
        self._set_xdp(ifindex, -1, XDP_MODE_FLAGS[mode], f"detaching calico_xdp ({mode})")

    def _set_xdp(self, ifindex: int, fd: int, flags: int, what: str) -> None:
        try:
            self._ipr.link("set", index=ifindex, xdp={"attrs": [
                ("IFLA_XDP_FD", fd), ("IFLA_XDP_FLAGS", flags)]})
        except Exception as exc:
            raise _failed(what, ifindex, exc) from exc

    def prog_name(self, prog_id: int) -> str | None:
        info = syscall.prog_info_by_id(prog_id)
        return info.name if info is not None else None
