"""BPF attach manager: our tc programs on every workload interface, XDP where host endpoints
have untracked deny rules.

Role: keeps, in the agent's own network namespace,
- on every interface whose name starts with an interface prefix (`cali` by default): a
  clsact qdisc with `calico_from_wep` at tc ingress (what the pod sends) and `calico_to_wep`
  at tc egress (what the pod receives), as filters named `pyfelix:<prog>:<prog id>` at our
  priority/handle (agent.bpf.attach);
- `calico_xdp` on each host interface of a host endpoint with untracked (doNotTrack)
  policy: by name, or (name "") every interface carrying one of its expected IPs (`*`:
  every interface that is not a workload interface or `lo`), and on no other. Mode, as
  Felix: native (the driver's hook) first, generic only if allowed (`xdp_modes`, from
  GenericXDPEnabled); an interface that takes neither has none (iptables' raw chains still
  enforce the untracked policy; logged once per interface and resync). XDPEnabled false:
  no XDP program at all (`xdp_program` None; ours are removed);
- `calico_from_hep` at tc ingress of every host interface of a host endpoint (resolved the
  same way, whatever its policy): the reverse-path check of Felix's BPFEnforceRPF (the mode
  is in the config map; Disabled passes everything). Removed from an interface that stops
  being a host endpoint's (only our filter, at our slot). It also serves NodePorts
  (bpf/include/nat.h);
- `calico_from_host` (NodePorts only) at tc ingress of every other data interface (name
  matching `data_iface_pattern`, Felix's BPFDataIfacePattern; never a workload interface
  or `lo`) while at least one NodePort frontend exists (ServiceFrontendUpdate of kind
  "nodeport"): without NodePorts, such interfaces carry no program of ours, as before.

Inputs (`on_update`): ServiceFrontendUpdate/Remove (NodePorts only), InterfaceUpdate (a new
interface is checked in the very next apply, which the loop runs right after the batch:
attach latency is the loop's batch latency, see `pyfelix_bpf_attach_latency_seconds`),
HostEndpointUpdate/Remove, InSync.

`apply()` checks only the interfaces marked dirty (new ones, all of them at a resync):
lists that hook's filters; keeps ours if it runs the current program; replaces ours if it
runs a stale one (an older build: after an agent restart the new programs take over
atomically with `tc filter replace`); deletes extra filters of ours at other
priorities/handles; never touches a filter that is not ours, and raises if a foreign
filter sits at our priority/handle (the interface would run someone else's program first).
An interface that vanished meanwhile is forgotten, not an error.

`finish_apply()`: after the first fully successful round following InSync, every workload
interface runs the current build, so the previous builds' private pins (prog array, walker
scratch) are swept (`on_all_current`, given by the builder).

Invariants: nothing is detached that is not ours; filters die with their interface, so
nothing is detached when an interface goes away; programs stay attached when the agent
exits (kill -9 included): the maps and prog array they use are pinned.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyfelix.agent import proto
from pyfelix.agent.bpf.attach import (
    FILTER_NAME_PREFIX,
    TC_HANDLE,
    TC_PRIO,
    XDP_PROG_NAME,
    Attacher,
    AttachError,
    InterfaceGone,
    filter_name,
)
from pyfelix.agent.dataplane.events import IFACE_ABSENT, InterfaceAddrsUpdate, InterfaceUpdate
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.dataplane.managers import bpf_metrics as metrics
from pyfelix.agent.dataplane.managers.hostips import resolve_host_endpoints

log = logging.getLogger(__name__)

HOOKS = ("ingress", "egress")
HEP_PROGRAM = "calico_from_hep"
HOST_PROGRAM = "calico_from_host"
NODEPORT_KIND = "nodeport"  # ServiceFrontendUpdate.kind of a NodePort frontend
# Felix's BPFDataIfacePattern default, less its tunnel devices: the node's physical
# and bonded interfaces
DEFAULT_DATA_IFACE_PATTERN = r"^((en|wl|ww|sl|ib)[Popsx].*|(eth|wlan|wwan|bond).*)$"


@dataclass(frozen=True)
class ProgramRef:
    """A loaded program: fd to attach, kernel id (tells builds apart), name."""

    fd: int
    prog_id: int
    name: str


class BpfAttachManager(ManagerBase):
    name = "bpf-attach"
    policy_critical = True

    def __init__(
        self,
        tc_programs: dict[str, ProgramRef],
        xdp_program: ProgramRef | None,
        *,
        hep_program: ProgramRef | None = None,
        host_program: ProgramRef | None = None,
        data_iface_pattern: str = DEFAULT_DATA_IFACE_PATTERN,
        xdp_modes: tuple[str, ...] = ("native", "generic"),
        interface_prefixes: tuple[str, ...] = ("cali",),
        attacher: Attacher | None = None,
        attacher_factory: Callable[[], Attacher] | None = None,
        on_all_current: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        if set(tc_programs) != set(HOOKS):
            raise ValueError(f"BpfAttachManager: tc_programs must name hooks {HOOKS}")
        self._tc = tc_programs
        self._xdp = xdp_program
        self._xdp_modes = xdp_modes
        self._xdp_unsupported: set[int] = set()  # no allowed mode works there: iptables only
        self._hep = hep_program
        self._host = host_program
        self._data_iface = re.compile(data_iface_pattern)
        self._nodeports: set[str] = set()  # NodePort frontend ids
        self._prefixes = interface_prefixes
        self._attacher = attacher
        self._attacher_factory = attacher_factory
        self._on_all_current = on_all_current
        self._clock = clock
        self._links: dict[str, int] = {}  # every interface we know of: name -> ifindex
        self._links_listed = False  # _links came from a complete dump (not only messages)
        self._dirty: set[int] = set()  # workload ifindexes to check
        self._first_seen: dict[int, float] = {}  # for attach latency
        self._current: set[int] = set()  # workload ifindexes known to run our programs
        # host endpoints with untracked policy, and interface addresses (endpoints known by
        # their expected IPs apply to the interfaces carrying them)
        self._xdp_wanted: dict[proto.HostEndpointID, proto.HostEndpoint] = {}
        self._host_endpoints: dict[proto.HostEndpointID, proto.HostEndpoint] = {}
        # host ifindexes running calico_from_hep or calico_from_host -> that program's name
        self._hep_attached: dict[int, str] = {}
        self._addrs: dict[str, frozenset[str]] = {}
        self._xdp_attached: dict[int, int] = {}  # ifindex -> our XDP prog id
        self._hep_dirty = True
        self._hep_check_all = True
        self._swept = False
        self.attach_latencies: list[float] = []
        self.on_close: Callable[[], None] | None = None  # releases the shared build

    # --- messages --------------------------------------------------------------------------

    def on_update(self, msg: object) -> None:
        if isinstance(msg, InterfaceUpdate):
            self._on_interface(msg)
        elif isinstance(msg, InterfaceAddrsUpdate):
            if msg.addrs is None:
                self._addrs.pop(msg.name, None)
            else:
                self._addrs[msg.name] = msg.addrs
            if self._host_endpoints:
                self._hep_dirty = True
        elif isinstance(msg, proto.ServiceFrontendUpdate | proto.ServiceFrontendRemove):
            had = bool(self._nodeports)
            if isinstance(msg, proto.ServiceFrontendUpdate) and msg.kind == NODEPORT_KIND:
                self._nodeports.add(msg.id)
            else:
                self._nodeports.discard(msg.id)
            if had != bool(self._nodeports):
                self._hep_dirty = True
                self._hep_check_all = True
        elif isinstance(msg, proto.HostEndpointUpdate):
            self._host_endpoints[msg.id] = msg.endpoint
            if msg.endpoint.untracked_tiers:
                self._xdp_wanted[msg.id] = msg.endpoint
            else:
                self._xdp_wanted.pop(msg.id, None)
            self._hep_dirty = True
        elif isinstance(msg, proto.HostEndpointRemove):
            self._host_endpoints.pop(msg.id, None)
            self._xdp_wanted.pop(msg.id, None)
            self._hep_dirty = True
        elif isinstance(msg, proto.InSync):
            self._datastore_in_sync = True
            self._hep_dirty = True

    def _on_interface(self, msg: InterfaceUpdate) -> None:
        if msg.state == IFACE_ABSENT:
            if self._links.get(msg.name) == msg.index:
                del self._links[msg.name]
                self._forget(msg.index)
                self._hep_dirty = True
            return
        old = self._links.get(msg.name)
        if old == msg.index:
            return
        if old is not None:
            self._forget(old)
        self._links[msg.name] = msg.index
        if self._is_workload(msg.name):
            self._dirty.add(msg.index)
            self._first_seen.setdefault(msg.index, self._clock())
        self._hep_dirty = True

    def _forget(self, ifindex: int) -> None:
        self._dirty.discard(ifindex)
        self._current.discard(ifindex)
        self._first_seen.pop(ifindex, None)
        self._xdp_attached.pop(ifindex, None)
        self._xdp_unsupported.discard(ifindex)
        self._hep_attached.pop(ifindex, None)

    def _is_workload(self, name: str) -> bool:
        return name.startswith(self._prefixes)

    # --- apply -----------------------------------------------------------------------------

    def apply(self) -> None:
        attacher = self._get_attacher()
        if self._resync_requested:
            self._links = attacher.list_links()
            self._links_listed = True
            self._current.clear()
            self._xdp_attached.clear()
            self._xdp_unsupported.clear()
            self._hep_attached.clear()
            self._dirty = {i for n, i in self._links.items() if self._is_workload(n)}
            self._hep_dirty = True
            self._hep_check_all = True  # a stale XDP program of ours may be anywhere
            self._resync_requested = False
        errors: list[str] = []
        for ifindex in sorted(self._dirty):
            try:
                self._attach_tc(attacher, ifindex)
            except InterfaceGone:
                self._forget_index(ifindex)
                continue
            except AttachError as exc:
                metrics.ATTACH_ERRORS.inc()
                errors.append(str(exc))
                continue
            self._dirty.discard(ifindex)
            self._current.add(ifindex)
            seen = self._first_seen.pop(ifindex, None)
            if seen is not None:
                latency = self._clock() - seen
                self.attach_latencies.append(latency)
                del self.attach_latencies[:-1000]
                metrics.ATTACH_LATENCY.observe(latency)
        if self._hep_dirty:
            errors += self._sync_xdp(attacher)
        for hook in HOOKS:
            metrics.ATTACHED_INTERFACES.labels(hook).set(len(self._current))
        if errors:
            raise AttachError("; ".join(errors))

    def _forget_index(self, ifindex: int) -> None:
        for name, index in list(self._links.items()):
            if index == ifindex:
                del self._links[name]
        self._forget(ifindex)

    def _attach_tc(self, attacher: Attacher, ifindex: int) -> None:
        attacher.ensure_clsact(ifindex)
        for hook in HOOKS:
            prog = self._tc[hook]
            want = filter_name(prog.name, prog.prog_id)
            present = attacher.list_filters(ifindex, hook)
            at_our_slot = [f for f in present if (f.prio, f.handle) == (TC_PRIO, TC_HANDLE)]
            if at_our_slot and not at_our_slot[0].ours:
                raise AttachError(
                    f"ifindex {ifindex} tc {hook}: a filter that is not ours "
                    f"({at_our_slot[0].kind} {at_our_slot[0].name!r}) holds priority "
                    f"{TC_PRIO} handle {TC_HANDLE}; not replacing it")
            if not at_our_slot or at_our_slot[0].name != want:
                if at_our_slot:
                    log.info("ifindex %d tc %s: replacing %s with %s", ifindex, hook,
                             at_our_slot[0].name, want)
                attacher.replace_filter(ifindex, hook, prog.fd, want)
            for f in present:
                if f.ours and (f.prio, f.handle) != (TC_PRIO, TC_HANDLE):
                    attacher.delete_filter(ifindex, hook, f.prio, f.handle)

    def _sync_xdp(self, attacher: Attacher) -> list[str]:
        """XDP and calico_from_hep on host endpoint interfaces, calico_from_host on the other
        data interfaces while NodePorts exist, and neither on any other interface."""
        wanted = self._xdp_interfaces()
        hep_wanted = self._host_interfaces(self._host_endpoints) if self._hep else set()
        nodeports = bool(self._nodeports) and self._host is not None
        errors = []
        for name, ifindex in sorted(self._links.items()):
            try:
                if ifindex in wanted:
                    self._ensure_xdp(attacher, name, ifindex)
                elif self._datastore_in_sync and (
                        ifindex in self._xdp_attached
                        or (self._hep_check_all and not self._is_workload(name))):
                    self._remove_xdp(attacher, ifindex)
                if ifindex in hep_wanted:
                    assert self._hep is not None
                    self._ensure_hep_tc(attacher, ifindex, self._hep)
                elif nodeports and self._is_data_iface(name):
                    assert self._host is not None
                    self._ensure_hep_tc(attacher, ifindex, self._host)
                elif self._datastore_in_sync and (
                        ifindex in self._hep_attached
                        or (self._hep_check_all and not self._is_workload(name))):
                    self._remove_hep_tc(attacher, ifindex)
            except InterfaceGone:
                continue
            except AttachError as exc:
                metrics.ATTACH_ERRORS.inc()
                errors.append(str(exc))
        if not errors:
            self._hep_dirty = False
            if self._datastore_in_sync:
                self._hep_check_all = False
        return errors

    def _is_data_iface(self, name: str) -> bool:
        return (not self._is_workload(name) and name != "lo"
                and self._data_iface.match(name) is not None)

    def _xdp_interfaces(self) -> set[int]:
        if self._xdp is None:
            return set()
        return self._host_interfaces(self._xdp_wanted)

    def _host_interfaces(self, endpoints: dict[proto.HostEndpointID, proto.HostEndpoint]
                         ) -> set[int]:
        """Ifindexes of the host interfaces these host endpoints apply to."""
        if not endpoints:
            return set()
        names = set(resolve_host_endpoints(endpoints, self._addrs, self._prefixes))
        out = set()
        for name, ifindex in self._links.items():
            if self._is_workload(name) or name == "lo":
                continue
            if name in names or "*" in names:
                out.add(ifindex)
        return out

    def _ensure_xdp(self, attacher: Attacher, name: str, ifindex: int) -> None:
        assert self._xdp is not None
        if self._xdp_attached.get(ifindex) == self._xdp.prog_id:
            return
        current = attacher.xdp_prog_id(ifindex)
        if current == self._xdp.prog_id:
            self._xdp_attached[ifindex] = current
            return
        if current and attacher.prog_name(current) != XDP_PROG_NAME:
            raise AttachError(f"{name}: an XDP program that is not ours (id {current}) is "
                              f"attached; not replacing it")
        if current:
            # a stale build of ours: replaced atomically in the mode it runs in
            attacher.set_xdp(ifindex, self._xdp.fd, attacher.xdp_mode(ifindex) or "generic")
            self._xdp_attached[ifindex] = self._xdp.prog_id
            return
        if ifindex in self._xdp_unsupported:
            return
        refused = []
        for mode in self._xdp_modes:
            try:
                attacher.set_xdp(ifindex, self._xdp.fd, mode)
            except InterfaceGone:
                raise
            except AttachError as exc:
                refused.append(f"{mode}: {exc}")
                continue
            self._xdp_attached[ifindex] = self._xdp.prog_id
            log.info("XDP: calico_xdp on %s in %s mode", name, mode)
            return
        # Not a failure: XDP only drops early what iptables' raw chains (untracked policy)
        # drop anyway. Retried when the interface changes or at a resync.
        self._xdp_unsupported.add(ifindex)
        log.warning("XDP: %s takes no allowed XDP mode (%s)%s; its untracked deny rules are "
                    "enforced by iptables only", name, "; ".join(refused),
                    "" if "generic" in self._xdp_modes else
                    " (GenericXDPEnabled is false)")

    def _ensure_hep_tc(self, attacher: Attacher, ifindex: int, prog: ProgramRef) -> None:
        """`prog` (calico_from_hep or calico_from_host) at our ingress slot of ifindex."""
        if self._hep_attached.get(ifindex) == prog.name:
            return
        attacher.ensure_clsact(ifindex)
        want = filter_name(prog.name, prog.prog_id)
        present = [f for f in attacher.list_filters(ifindex, "ingress")
                   if (f.prio, f.handle) == (TC_PRIO, TC_HANDLE)]
        if present and not present[0].ours:
            raise AttachError(
                f"ifindex {ifindex} tc ingress: a filter that is not ours "
                f"({present[0].kind} {present[0].name!r}) holds priority {TC_PRIO} handle "
                f"{TC_HANDLE}; not replacing it")
        if not present or present[0].name != want:
            attacher.replace_filter(ifindex, "ingress", prog.fd, want)
        self._hep_attached[ifindex] = prog.name

    def _remove_hep_tc(self, attacher: Attacher, ifindex: int) -> None:
        prefixes = tuple(f"{FILTER_NAME_PREFIX}{name}:" for name in (HEP_PROGRAM, HOST_PROGRAM))
        for f in attacher.list_filters(ifindex, "ingress"):
            if f.ours and f.name.startswith(prefixes):
                attacher.delete_filter(ifindex, "ingress", f.prio, f.handle)
        self._hep_attached.pop(ifindex, None)

    def _remove_xdp(self, attacher: Attacher, ifindex: int) -> None:
        current = attacher.xdp_prog_id(ifindex)
        if current and attacher.prog_name(current) == XDP_PROG_NAME:
            attacher.clear_xdp(ifindex)
        self._xdp_attached.pop(ifindex, None)

    def finish_apply(self) -> None:
        if self._swept or not self._datastore_in_sync or self._dirty:
            return
        if self._on_all_current is not None:
            self._on_all_current()
        self._swept = True

    def _get_attacher(self) -> Attacher:
        if self._attacher is None:
            if self._attacher_factory is not None:
                self._attacher = self._attacher_factory()
            else:
                from pyfelix.agent.bpf.attach import PyRoute2Attacher

                self._attacher = PyRoute2Attacher()
        return self._attacher

    def close(self) -> None:
        """Programs stay attached; only our netlink socket (and build handle) go."""
        if self._attacher is not None:
            self._attacher.close()
            self._attacher = None
        if self.on_close is not None:
            self.on_close()
            self.on_close = None

    # --- introspection -----------------------------------------------------------------

    @property
    def attached(self) -> frozenset[int]:
        return frozenset(self._current)

    @property
    def host_endpoint_interfaces(self) -> frozenset[int]:
        """Host interfaces running calico_from_hep."""
        return frozenset(i for i, name in self._hep_attached.items() if name == HEP_PROGRAM)

    @property
    def nodeport_interfaces(self) -> frozenset[int]:
        """Data interfaces running calico_from_host (NodePorts only)."""
        return frozenset(i for i, name in self._hep_attached.items() if name == HOST_PROGRAM)

    @property
    def links(self) -> dict[str, int]:
        """Every interface of the namespace we know of: name -> ifindex."""
        return dict(self._links)

    @property
    def links_listed(self) -> bool:
        """`links` has been read from a complete dump of the namespace's interfaces (until
        then, an interface missing from it may simply not be reported yet)."""
        return self._links_listed
