"""BPF cleanup manager (iptables mode only): remove what an earlier BPF-mode agent left.

Role: Felix, started with BPF mode off, removes its BPF programs and pins. A node switched
from BPF mode to iptables mode (BPFEnabled=false, or BPFFallback=iptables when the BPF
build fails) still has the previous agent's tc filters, XDP program and pinned maps: those
programs keep judging traffic by the policy of the day the BPF agent stopped, on top of the
iptables chains. This manager detaches them and unpins the maps.

Inputs: `InSync` only (`on_update` ignores everything else). Kernel: the `Attacher` shim of
`agent.bpf.attach` (pyroute2 in the manager's network namespace in production, a fake in
unit tests) and the pin directory (`BPFPinDir`).

When: in `finish_apply()` of the first round after InSync, retried in later rounds until
one sweep succeeds, then never again in this process: only an agent in BPF mode attaches
our programs, and a node runs one agent, so nothing can bring them back while this one
runs (switching the mode restarts the agent, which sweeps again). Sweeping at every resync
would cost the loop thread a link dump and filter dumps per interface each interval
(~35 ms for 21 interfaces, ~280 ms for 201) for nothing. `finish_apply` runs only when
every manager's `apply()` succeeded in the round, and `linux_managers()` puts this manager
LAST: the iptables chains for the current policy are programmed before the stale programs
go (make before break). `apply()` does nothing.

What (ownership as in `agent.bpf.attach`, nothing else is ever touched):
- every interface of the namespace (not only workload ones), both tc hooks: filters that
  are ours (`TcFilter.ours`: kind bpf, name `pyfelix:...`) are deleted; any other filter,
  whatever its kind or priority, stays;
- XDP: the attached program is cleared only if the kernel names it `calico_xdp`;
- then, once no detach failed in the sweep, the pin directory is removed (in this mount
  namespace, or the host's through /proc/1/root when `ip netns exec` hid it), and only if
  it is on a bpf filesystem and is not the filesystem's root (`BPFPinDir=/sys/fs/bpf`
  would make "our directory" everyone's: that is refused with a warning). Pins go last
  because a program still attached tail-calls through the pinned program array.
- the clsact qdisc is LEFT in place, even when no filter remains under it: nothing marks a
  clsact as ours (`ensure_clsact` adopts an existing one), deleting it deletes every filter
  under it (one another tool adds between our listing and the delete included), and an
  empty clsact passes every packet unchanged.

Errors: stale programs only make the node stricter (a packet must pass them AND the
chains), so this manager is not policy-critical: a failed detach or unpin is logged,
counted (`pyfelix_bpf_cleanup_errors_total`), and raised after the sweep so the loop
retries the round with backoff (the first in-sync, hence readiness, waits for it: until
then the node still enforces stale policy too). An interface that vanished meanwhile is
skipped, not an error (its filters and XDP program died with it). What was removed is
counted (`pyfelix_bpf_cleanup_removed_total{kind}`) and logged with numbers.

Cost of the one sweep when there is nothing to remove: one link dump plus, per interface,
two filter dumps and one link query; no writes. Measured (this 2-core machine, veths in a
namespace): ~35 ms for 21 interfaces, ~280 ms for 201, nearly all of it pyroute2 parsing
link messages (the dump, then one `xdp_prog_id` query per link).

Imports: no BCC here or below (a node falling back to iptables may have none: the loader
imports bcc only inside `load_dataplane`); pyroute2 is imported when the attacher is made.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

from agent import proto
from agent.bpf.attach import XDP_PROG_NAME, Attacher, AttachError, InterfaceGone
from agent.bpf.loader import HOST_ROOT, bpffs_mount_of, remove_pin_dir
from agent.dataplane.manager import ManagerBase

log = logging.getLogger(__name__)

HOOKS = ("ingress", "egress")

CLEANUP_ERRORS = Counter(
    "pyfelix_bpf_cleanup_errors",
    "Number of failures removing an earlier BPF-mode agent's programs or pins in iptables "
    "mode (each failed sweep is retried by the dataplane loop).",
)
CLEANUP_REMOVED = Counter(
    "pyfelix_bpf_cleanup_removed",
    "Number of objects of an earlier BPF-mode agent removed in iptables mode, by kind "
    "(tc_filter, xdp_program, pin).",
    ["kind"],
)


class BpfCleanupError(RuntimeError):
    """Some of our programs or pins could not be removed; the sweep is retried."""


@dataclass
class SweepResult:
    """What one sweep removed (and which interfaces it touched)."""

    tc_filters: int = 0
    xdp_programs: int = 0
    interfaces: int = 0
    pins: int = 0
    pin_dir: str | None = None  # the pin directory removed, if one was there

    @property
    def anything(self) -> bool:
        return bool(self.tc_filters or self.xdp_programs or self.pin_dir)


def locate_pin_dir(pin_dir: str) -> str | None:
    """Where `pin_dir` is, as `agent.bpf.loader.resolve_pin_dir` would have pinned it (our
    mount namespace's bpffs, else the host's through /proc/1/root), if it exists there.
    None when it does not exist or is on no bpf filesystem (then it holds no pins of ours,
    and a misconfigured BPFPinDir is never emptied). Raises ValueError when it is the root
    of a bpf filesystem."""
    pin_dir = os.path.abspath(pin_dir)
    for mounts_file, prefix in (("/proc/self/mounts", ""), ("/proc/1/mounts", HOST_ROOT)):
        mount = bpffs_mount_of(pin_dir, mounts_file)
        if mount is None:
            continue
        if os.path.normpath(mount) == os.path.normpath(pin_dir):
            raise ValueError(f"BPFPinDir {pin_dir!r} is the root of a bpf filesystem, not a "
                             "directory of ours; not removing it")
        path = prefix + pin_dir
        return path if os.path.isdir(path) else None
    return None


def _count_pins(path: str) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


class BpfCleanupManager(ManagerBase):
    """Detaches our tc/XDP programs and removes our pins after in-sync (see module doc)."""

    name = "bpf-cleanup"
    policy_critical = False

    def __init__(
        self,
        pin_dir: str | None,
        *,
        netns: str | None = None,
        attacher: Attacher | None = None,
        attacher_factory: Callable[[], Attacher] | None = None,
        locate_pins: Callable[[str], str | None] = locate_pin_dir,
        remove_pins: Callable[[str], None] = remove_pin_dir,
    ) -> None:
        super().__init__()
        self._pin_dir = pin_dir
        self._netns = netns
        self._attacher = attacher
        self._attacher_factory = attacher_factory
        self._locate_pins = locate_pins
        self._remove_pins = remove_pins
        self._refused_pin_dir = False  # warned once about an unremovable BPFPinDir
        self.sweeps = 0  # completed sweeps (tests, debugging)
        self.last: SweepResult | None = None

    def on_update(self, msg: object) -> None:
        if isinstance(msg, proto.InSync):
            self._datastore_in_sync = True

    def apply(self) -> None:
        return None  # everything happens in finish_apply, after the chains are in place

    def finish_apply(self) -> None:
        if not self._datastore_in_sync or self.sweeps:
            return  # not yet, or done for the life of this process (module docstring)
        result = SweepResult()
        errors = self._detach_all(result)
        if not errors:
            errors += self._remove_pin_dir(result)
        CLEANUP_REMOVED.labels("tc_filter").inc(result.tc_filters)
        CLEANUP_REMOVED.labels("xdp_program").inc(result.xdp_programs)
        CLEANUP_REMOVED.labels("pin").inc(result.pins)
        if result.anything:
            log.info("BPF cleanup (iptables mode): removed %d tc filter(s) and %d XDP "
                     "program(s) of ours on %d interface(s); pin directory %s (%d pins)",
                     result.tc_filters, result.xdp_programs, result.interfaces,
                     result.pin_dir or "absent", result.pins)
        self.last = result
        if errors:
            CLEANUP_ERRORS.inc(len(errors))
            for error in errors:
                log.warning("BPF cleanup (iptables mode): %s; will retry", error)
            raise BpfCleanupError("; ".join(errors))
        self.sweeps += 1

    def _detach_all(self, result: SweepResult) -> list[str]:
        try:
            attacher = self._get_attacher()
            links = attacher.list_links()
        except (AttachError, OSError) as exc:
            return [f"listing interfaces: {exc}"]
        errors = []
        for name, ifindex in sorted(links.items()):
            try:
                removed = self._detach(attacher, ifindex, result)
            except InterfaceGone:
                continue  # its filters and XDP program went with it
            except (AttachError, OSError) as exc:  # OSError: the bpf() syscall (prog name)
                errors.append(f"{name}: {exc}")
                continue
            if removed:
                result.interfaces += 1
        return errors

    def _detach(self, attacher: Attacher, ifindex: int, result: SweepResult) -> bool:
        removed = False
        for hook in HOOKS:
            for tc_filter in attacher.list_filters(ifindex, hook):
                if tc_filter.ours:
                    attacher.delete_filter(ifindex, hook, tc_filter.prio, tc_filter.handle)
                    result.tc_filters += 1
                    removed = True
        prog_id = attacher.xdp_prog_id(ifindex)
        if prog_id and attacher.prog_name(prog_id) == XDP_PROG_NAME:
            attacher.clear_xdp(ifindex)
            result.xdp_programs += 1
            removed = True
        return removed

    def _remove_pin_dir(self, result: SweepResult) -> list[str]:
        if not self._pin_dir:
            return []
        try:
            path = self._locate_pins(self._pin_dir)
        except ValueError as exc:
            if not self._refused_pin_dir:
                log.warning("BPF cleanup (iptables mode): %s", exc)
                self._refused_pin_dir = True
            return []
        if path is None:
            return []
        try:
            pins = _count_pins(path)
            self._remove_pins(path)
        except OSError as exc:
            return [f"removing pin directory {path}: {exc}"]
        result.pins = pins
        result.pin_dir = path
        return []

    def _get_attacher(self) -> Attacher:
        if self._attacher is None:
            if self._attacher_factory is not None:
                self._attacher = self._attacher_factory()
            else:
                from agent.bpf.attach import PyRoute2Attacher

                self._attacher = PyRoute2Attacher(self._netns)
        return self._attacher

    def close(self) -> None:
        if self._attacher is not None:
            self._attacher.close()
            self._attacher = None
