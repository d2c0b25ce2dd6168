"""BPF cleanup manager (iptables mode only): remove what an earlier BPF-mode agent left.

Role: Felix, started with BPF mode off, removes its BPF programs and pins. A node switched
from BPF mode to iptables mode (BPFEnabled=false, or BPFFallback=iptables when the BPF
build fails) still has the previous agent's tc filters, XDP program and pinned maps: those
programs keep judging traffic by the policy of the day the BPF agent stopped, on top of the
iptables chains. This manager detaches them and unpins the maps.

Inputs: `InSync` only (`on_update` ignores everything else). Kernel: the `Attacher` shim of
`agent.bpf.attach` (pyroute2 in the manager's network namespace in production, a fake in
unit tests) and the pin directory (`BPFPinDir`). A clock (`agent.shims.clock`) for its own
retry backoff. Outputs: programs detached, pins unlinked, metrics, log lines; nothing is
ever raised to the loop. Also the BPF mode's nft guard table (`agent.shims.nft_guard`,
when `remove_guard` is given): once our programs are detached, interfaces without them are
no longer "unprogrammed", and the guard would drop every workload's traffic.

When: in `finish_apply()` of the first round after InSync; once a sweep has succeeded,
never again in this process: only an agent in BPF mode attaches our programs, and a node
runs one agent, so nothing can bring them back while this one runs (switching the mode
restarts the agent, which sweeps again). Sweeping at every resync would cost the loop
thread a link dump and filter dumps per interface each interval (~35 ms for 21 interfaces,
~280 ms for 201) for nothing. `finish_apply` runs only when every manager's `apply()`
succeeded in the round, and `linux_managers()` puts this manager LAST: the iptables chains
for the current policy are programmed before the stale programs go (make before break).
`apply()` does nothing.

Errors, best effort: stale programs only make the node stricter (a packet must pass them
AND the chains), so a failed sweep must not hold up anything that enforces current policy.
Raising from `finish_apply` would: the loop would mark the whole round failed, every
manager's next apply (new policy included) would wait for the loop's backoff (up to 30 s),
and `loop.in_sync`, hence readiness, would never be set while the sweep kept failing (no
CAP_SYS_ADMIN for BPF_PROG_GET_FD_BY_ID, a read-only bpffs...). So `finish_apply` never
raises, and the first in-sync does NOT wait for the sweep: readiness means the chains of
the current policy are in place; stale programs beside them can only drop more. A failed
sweep is logged (warning), counted (`pyfelix_bpf_cleanup_errors_total`) and retried on this
manager's OWN backoff (1 s, doubling, at most 300 s): a later round's `finish_apply` sweeps
again only once that time has come. Rounds happen on every change and at every periodic
resync (90 s by default), so no timer thread is needed; a retry may come up to one resync
interval after it is due. An interface that vanished meanwhile is skipped, not an error (its
filters and XDP program died with it). What was removed is counted
(`pyfelix_bpf_cleanup_removed_total{kind}`) and logged with numbers. The attacher (a
netlink socket) is closed after the successful sweep: it is not needed again.

What (ownership as in `agent.bpf.attach`; nothing else is ever touched, apart from the
races below):
- every interface of the namespace (not only workload ones), both tc hooks: filters that
  are ours (`TcFilter.ours`: kind bpf, name `pyfelix:...`) are deleted; any other filter,
  whatever its kind or priority, stays;
- XDP: the attached program is cleared only if the kernel names it `calico_xdp`;
- then, once no detach failed in the sweep, our pins (`remove_our_pins`). Pins go last
  because a program still attached tail-calls through the pinned program array. The
  directory is found by `locate_pin_dir`: in this mount namespace, `os.path.realpath` first
  (a BPFPinDir that is a symlink is judged by where it leads), then it must be on a bpf
  filesystem and not be that filesystem's root (`BPFPinDir=/sys/fs/bpf`, or a link to it,
  would make "our directory" everyone's: refused with a warning); failing that, the host's
  view through /proc/1/root (when `ip netns exec` hid the host's bpffs), where a path with
  a symlink anywhere in it is refused (it would resolve against our root, not the host's).
  In that one directory (no recursion, no symlink followed: entries are examined through
  a descriptor of the directory opened with O_NOFOLLOW) an entry is unlinked only if it is
  neither a directory nor a symlink AND its name is ours: a data map's pin name
  (`ALL_MAPS`) or a build's private pin (`agent.bpf.loader.BUILD_PIN_PREFIXES`). The
  directory is removed only if that left it empty; otherwise a warning names what is left
  (another tool's pins, directories, links) and the directory stays;
- the clsact qdisc is LEFT in place, even when no filter remains under it: nothing marks a
  clsact as ours (`ensure_clsact` adopts an existing one), deleting it deletes every filter
  under it (one another tool adds between our listing and the delete included), and an
  empty clsact passes every packet unchanged.

Known races and limits (easy to get wrong):
- XDP is checked by name, then cleared: a foreign XDP program attached between the name
  check and the clear would be removed. Closing that needs XDP_FLAGS_REPLACE with
  IFLA_XDP_EXPECTED_FD (kernel >= 5.7); left for later. Likewise a tc filter is deleted
  by hook, priority and handle: another tool would have to put its own filter at exactly
  our priority and handle between the dump and the delete.
- The pin directory is host-wide (one bpffs per host) while the sweep covers one network
  namespace. In production one agent runs per node, so the two are the same node; agents
  sharing a host in several namespaces (the lab) must each have their own BPFPinDir, or an
  iptables-mode agent would unpin maps a BPF-mode neighbour uses.

Cost of the one sweep when there is nothing to remove: one link dump plus, per interface,
two filter dumps and one link query; no writes. Measured (this 2-core machine, veths in a
namespace): ~35 ms for 21 interfaces, ~280 ms for 201, nearly all of it pyroute2 parsing
link messages (the dump, then one `xdp_prog_id` query per link).

Imports: no BCC here or below (a node falling back to iptables may have none: the loader
imports bcc only inside `load_dataplane`); pyroute2 is imported when the attacher is made.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client import Counter

from pyfelix.agent import proto
from pyfelix.agent.bpf.attach import XDP_PROG_NAME, Attacher, AttachError, InterfaceGone
from pyfelix.agent.bpf.loader import BUILD_PIN_PREFIXES, HOST_ROOT, bpffs_mount_of
from pyfelix.agent.bpf.maps import ALL_MAPS
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.shims.clock import Clock, SystemClock

log = logging.getLogger(__name__)

HOOKS = ("ingress", "egress")
RETRY_INITIAL = 1.0  # seconds before the first retry of a failed sweep
RETRY_MAX = 300.0  # the doubling stops here

# (mounts file, path prefix reaching that mount namespace's files): ours, then the host's
MOUNT_VIEWS: tuple[tuple[str, str], ...] = (("/proc/self/mounts", ""),
                                            ("/proc/1/mounts", HOST_ROOT))

# every version of each data map's pin: a node may hold an earlier release's pins (a layout
# change bumps the version, e.g. the IPv6 keys took ipsets_v1 to ipsets_v2)
OUR_PIN_NAMES = frozenset(f"{params.name}_v{v}" for params in ALL_MAPS
                          for v in range(1, params.version + 1))

CLEANUP_ERRORS = Counter(
    "pyfelix_bpf_cleanup_errors",
    "Number of failures removing an earlier BPF-mode agent's programs or pins in iptables "
    "mode (a failed sweep is retried on the cleanup's own backoff, 1 s doubling to 300 s; "
    "policy and readiness do not wait for it).",
)
CLEANUP_REMOVED = Counter(
    "pyfelix_bpf_cleanup_removed",
    "Number of objects of an earlier BPF-mode agent removed in iptables mode, by kind "
    "(tc_filter, xdp_program, pin).",
    ["kind"],
)


@dataclass
class SweepResult:
    """What one sweep removed (and which interfaces it touched)."""

    tc_filters: int = 0
    xdp_programs: int = 0
    interfaces: int = 0
    pins: int = 0
    ctlb_programs: int = 0  # cgroup programs of the connect-time load balancer
    guard: bool = False  # the nft guard table was removed
    pin_dir: str | None = None  # the pin directory removed, if one was there
    left_in_pin_dir: list[str] = field(default_factory=list)  # entries not ours, kept

    @property
    def anything(self) -> bool:
        return bool(self.tc_filters or self.xdp_programs or self.pins or self.pin_dir
                    or self.guard or self.ctlb_programs)


@dataclass
class PinRemoval:
    """What `remove_our_pins` did in one directory."""

    removed: list[str] = field(default_factory=list)  # our pins, unlinked
    left: list[str] = field(default_factory=list)  # everything else, untouched
    dir_removed: bool = False


def is_our_pin_name(name: str) -> bool:
    """A name the loader pins under BPFPinDir: a data map's, or a build's private pins."""
    return name in OUR_PIN_NAMES or name.startswith(BUILD_PIN_PREFIXES)


def remove_our_pins(path: str) -> PinRemoval:
    """Unlink our pins in directory `path`, then remove it if that left it empty.

    Only `path` itself is read (no recursion). An entry goes only if `lstat` says it is
    neither a directory nor a symlink and `is_our_pin_name` accepts its name; everything
    else is listed in `left` and stays, and so does the directory. Entries are reached
    through a descriptor of `path` opened with O_NOFOLLOW, so unlinks stay in that
    directory. A `path` that does not exist is nothing to do. Raises OSError when the
    directory cannot be read or an unlink or the rmdir fails (a read-only bpffs...)."""
    result = PinRemoval()
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return result
    try:
        for name in sorted(os.listdir(dir_fd)):
            try:
                mode = os.lstat(name, dir_fd=dir_fd).st_mode
            except FileNotFoundError:
                continue  # gone meanwhile
            if stat.S_ISDIR(mode) or stat.S_ISLNK(mode) or not is_our_pin_name(name):
                result.left.append(name)
                continue
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            result.removed.append(name)
    finally:
        os.close(dir_fd)
    if result.left:
        return result
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return result
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        result.left = sorted(os.listdir(path))  # someone pinned there meanwhile
        return result
    result.dir_removed = True
    return result


def refuse_bpffs_root(pin_dir: str, mount: str) -> None:
    """Raise ValueError when `pin_dir` (already resolved) is the bpf filesystem's root."""
    if os.path.normpath(mount) == os.path.normpath(pin_dir):
        raise ValueError(f"BPFPinDir resolves to {pin_dir!r}, the root of a bpf filesystem, "
                         "not a directory of ours; not removing anything there")


def _symlink_on_path(root: str, path: str) -> str | None:
    """The first component of absolute `path` that is a symlink under `root`, if any."""
    prefix = ""
    for part in path.strip("/").split("/"):
        prefix += "/" + part
        try:
            if stat.S_ISLNK(os.lstat(root + prefix).st_mode):
                return prefix
        except FileNotFoundError:
            return None  # the rest does not exist either
    return None


def locate_pin_dir(pin_dir: str, *,
                   views: Sequence[tuple[str, str]] = MOUNT_VIEWS) -> str | None:
    """Where `pin_dir` really is, as `agent.bpf.loader.resolve_pin_dir` would have pinned it:
    in our mount namespace (after `os.path.realpath`), else in the host's through
    /proc/1/root (`views`: mounts file and path prefix of each namespace, tests pass their
    own). None when it does not exist or is on no bpf filesystem (then it holds no pins of
    ours, and a misconfigured BPFPinDir is never touched). Raises ValueError when it
    resolves to the root of a bpf filesystem, or (host view) has a symlink on its path."""
    for mounts_file, root in views:
        if not root:
            real = os.path.realpath(pin_dir)
            mount = bpffs_mount_of(real, mounts_file)
            if mount is None:
                continue
            refuse_bpffs_root(real, mount)
            return real if os.path.isdir(real) else None
        host_path = os.path.abspath(pin_dir)
        mount = bpffs_mount_of(host_path, mounts_file)
        if mount is None:
            continue
        try:
            link = _symlink_on_path(root, host_path)
            path = root + host_path
            found = os.path.isdir(path) and not os.path.islink(path)
        except OSError as exc:
            # e.g. EACCES on /proc/1/root/... from a process in another mount namespace
            # (`ip netns exec`): pins we cannot reach we cannot remove either
            log.info("BPF cleanup: the host's view of %s is not reachable (%s); pins there, "
                     "if any, stay", pin_dir, exc)
            return None
        if link is not None:
            raise ValueError(f"BPFPinDir {pin_dir!r} goes through a symlink ({link}) in the "
                             "host's mount namespace; not removing anything there")
        refuse_bpffs_root(host_path, mount)
        return path if found else None
    return None


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
        remove_pins: Callable[[str], PinRemoval] = remove_our_pins,
        clock: Clock | None = None,
        retry_initial: float = RETRY_INITIAL,
        retry_max: float = RETRY_MAX,
        remove_guard: Callable[[], bool] | None = None,
        detach_ctlb: Callable[[], int] | None = None,
    ) -> None:
        super().__init__()
        # the connect-time load balancer's cgroup programs (managers/bpf_ctlb.py): detached
        # with the rest, or they would keep sending host sockets to yesterday's backends
        self._detach_ctlb = detach_ctlb
        self._pin_dir = pin_dir
        # the BPF mode's nft guard table (agent.shims.nft_guard): removed once our programs
        # are detached (None: not this manager's business, e.g. unit tests)
        self._remove_guard = remove_guard
        self._netns = netns
        self._attacher = attacher
        self._attacher_factory = attacher_factory
        self._locate_pins = locate_pins
        self._remove_pins = remove_pins
        self._clock = clock or SystemClock()
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._refused_pin_dir = False  # warned once about an unremovable BPFPinDir
        self.sweeps = 0  # completed sweeps: 0 or 1 (tests, debugging)
        self.failed_sweeps = 0  # failed sweeps in a row
        self.next_attempt_at: float | None = None  # clock time; None: no backoff pending
        self.last: SweepResult | None = None

    @property
    def pin_dir(self) -> str | None:
        """The BPF-mode agent's pin directory this manager cleans up (BPFPinDir)."""
        return self._pin_dir

    def on_update(self, msg: object) -> None:
        if isinstance(msg, proto.InSync):
            self._datastore_in_sync = True

    def apply(self) -> None:
        return None  # everything happens in finish_apply, after the chains are in place

    def finish_apply(self) -> None:
        """One sweep when due; never raises (module docstring: "Errors, best effort")."""
        if not self._datastore_in_sync or self.sweeps:
            return  # not yet, or done for the life of this process
        if self.next_attempt_at is not None and self._clock.monotonic() < self.next_attempt_at:
            return  # backing off after a failed sweep
        try:
            errors = self._sweep()
        except Exception as exc:  # a bug or an error the shims do not wrap: still not fatal
            log.warning("BPF cleanup (iptables mode): unexpected error", exc_info=True)
            errors = [f"unexpected error: {exc!r}"]
        if errors:
            self._failed(errors)
            return
        self.sweeps += 1
        self.failed_sweeps = 0
        self.next_attempt_at = None
        try:
            self.close()  # the netlink socket is not needed again
        except Exception:
            log.warning("BPF cleanup (iptables mode): closing the attacher", exc_info=True)

    def _failed(self, errors: list[str]) -> None:
        CLEANUP_ERRORS.inc(len(errors))
        self.failed_sweeps += 1
        delay = min(self._retry_max,
                    self._retry_initial * 2 ** min(self.failed_sweeps - 1, 32))
        self.next_attempt_at = self._clock.monotonic() + delay
        for error in errors:
            log.warning("BPF cleanup (iptables mode): %s; retrying at the first dataplane "
                        "round after %.0f s (policy and readiness do not wait for it)",
                        error, delay)

    def _sweep(self) -> list[str]:
        result = SweepResult()
        self.last = result
        errors = self._detach_all(result)
        if self._detach_ctlb is not None:
            try:
                result.ctlb_programs = self._detach_ctlb()
            except OSError as exc:
                errors.append(f"detaching the connect-time load balancer: {exc}")
        if not errors and self._remove_guard is not None:
            try:
                result.guard = self._remove_guard()
            except Exception as exc:  # GuardError, OSError: retried with the rest
                errors.append(f"removing the BPF guard table: {exc}")
        if not errors:
            errors += self._remove_pin_dir(result)
        CLEANUP_REMOVED.labels("guard_table").inc(int(result.guard))
        CLEANUP_REMOVED.labels("tc_filter").inc(result.tc_filters)
        CLEANUP_REMOVED.labels("xdp_program").inc(result.xdp_programs)
        CLEANUP_REMOVED.labels("pin").inc(result.pins)
        CLEANUP_REMOVED.labels("ctlb_program").inc(result.ctlb_programs)
        if result.anything:
            log.info("BPF cleanup (iptables mode): removed %d tc filter(s) and %d XDP "
                     "program(s) of ours on %d interface(s), %d cgroup program(s), %d "
                     "pin(s); pin directory %s", result.tc_filters, result.xdp_programs,
                     result.interfaces, result.ctlb_programs, result.pins,
                     result.pin_dir or "absent or kept")
        return errors

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
            removal = self._remove_pins(path)
        except OSError as exc:
            return [f"removing our pins from {path}: {exc}"]
        result.pins = len(removal.removed)
        result.pin_dir = path if removal.dir_removed else None
        result.left_in_pin_dir = list(removal.left)
        if removal.left:
            log.warning("BPF cleanup (iptables mode): pin directory %s kept: it holds "
                        "entries that are not ours (left untouched): %s",
                        path, ", ".join(removal.left))
        return []

    def _get_attacher(self) -> Attacher:
        if self._attacher is None:
            if self._attacher_factory is not None:
                self._attacher = self._attacher_factory()
            else:
                from pyfelix.agent.bpf.attach import PyRoute2Attacher

                self._attacher = PyRoute2Attacher(self._netns)
        return self._attacher

    def close(self) -> None:
        attacher, self._attacher = self._attacher, None
        if attacher is not None:
            attacher.close()
