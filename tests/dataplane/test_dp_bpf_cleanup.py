"""BpfCleanupManager (iptables mode) on a stateful FakeAttacher and temporary directories:
ours removed at both hooks and from XDP, every foreign filter and XDP program kept, nothing
before InSync, one successful sweep per process (resyncs do not repeat it, the attacher is
closed after it), a vanished interface tolerated; failures logged, counted and NEVER raised
(pins kept until every detach worked), retried on the manager's own backoff (1 s doubling
to 300 s) while the real loop applies policy at once and reports in-sync; in the pin
directory only our pins go (no recursion, no symlink followed, foreign entries kept and
named), and a pin directory resolving to a bpffs root is refused; the wiring in
linux_managers / the daemon, and no `bcc` import on that path."""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from pyfelix.agent import proto as p
from pyfelix.agent.bpf.attach import AttachError, InterfaceGone, TcFilter, filter_name
from pyfelix.agent.dataplane.linux import LinuxDataplaneConfig, linux_managers
from pyfelix.agent.dataplane.loop import DataplaneLoop
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.dataplane.managers.bpf_cleanup import (
    BpfCleanupManager,
    PinRemoval,
    locate_pin_dir,
    remove_our_pins,
)
from tests.bpf.fakes import FakeAttacher
from tests.fakes.clock import FakeClock

REPO = Path(__file__).resolve().parents[2]
LOGGER = "pyfelix.agent.dataplane.managers.bpf_cleanup"

OURS_IN = TcFilter(1, 1, "bpf", filter_name("calico_from_wep", 501))
OURS_OUT = TcFilter(1, 1, "bpf", filter_name("calico_to_wep", 502))
OURS_OLD_BUILD = TcFilter(3, 7, "bpf", filter_name("calico_from_wep", 400))
FOREIGN_BPF = TcFilter(5, 1, "bpf", "cilium-like")
FOREIGN_LOOKALIKE = TcFilter(6, 1, "bpf", "pyfelix-but-not-ours")
FOREIGN_MATCHALL = TcFilter(7, 1, "matchall", "pyfelix:not-a-bpf-filter")
OUR_XDP, FOREIGN_XDP = 503, 600
OUR_PINS = ("ipsets_v1", "rules_v1", "progs_0123456789ab")


class Attacher(FakeAttacher):
    """FakeAttacher that counts calls, can make one interface vanish after the link dump,
    fail deletes on chosen ifindexes, and fail every link dump while `fail_listing`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.vanish_after_listing: set[str] = set()
        self.fail_delete_on: set[int] = set()
        self.fail_listing = False

    def list_links(self) -> dict[str, int]:
        self.calls += 1
        if self.fail_listing:
            raise AttachError("dumping links: EPERM")
        links = super().list_links()
        for name in self.vanish_after_listing:
            self.remove_link(name)
        self.vanish_after_listing = set()
        return links

    def list_filters(self, ifindex: int, hook: str) -> list[TcFilter]:
        self.calls += 1
        return super().list_filters(ifindex, hook)

    def delete_filter(self, ifindex: int, hook: str, prio: int, handle: int) -> None:
        self.calls += 1
        if ifindex in self.fail_delete_on:
            raise AttachError(f"deleting a tc {hook} filter on ifindex {ifindex}: EPERM")
        super().delete_filter(ifindex, hook, prio, handle)

    def xdp_prog_id(self, ifindex: int) -> int:
        self.calls += 1
        return super().xdp_prog_id(ifindex)


def node(tmp_path: Path) -> tuple[Attacher, Path]:
    """A namespace as a BPF-mode agent left it, plus a foreign tool's programs."""
    fake = Attacher()
    fake.programs = {OUR_XDP: "calico_xdp", FOREIGN_XDP: "other_xdp"}
    fake.add_link("lo", 1)
    fake.add_link("eth0", 2).xdp_prog_id = OUR_XDP
    fake.add_link("eth1", 3).xdp_prog_id = FOREIGN_XDP
    for name, ifindex in (("cali1", 11), ("cali2", 12)):
        iface = fake.add_link(name, ifindex)
        iface.clsact = True
        iface.filters = {"ingress": [OURS_IN, FOREIGN_BPF, FOREIGN_MATCHALL],
                         "egress": [OURS_OUT, FOREIGN_LOOKALIKE]}
    fake.links["cali2"].filters["ingress"].append(OURS_OLD_BUILD)
    pins = tmp_path / "pins"
    pins.mkdir(parents=True)
    for name in OUR_PINS:
        (pins / name).write_text("")
    return fake, pins


def manager(fake: Attacher, pins: Path, clock: FakeClock | None = None) -> BpfCleanupManager:
    return BpfCleanupManager(str(pins), attacher=fake, clock=clock or FakeClock(),
                             locate_pins=lambda d: d if os.path.isdir(d) else None)


def filters(fake: Attacher, name: str) -> dict[str, list[TcFilter]]:
    return {hook: list(fs) for hook, fs in fake.links[name].filters.items()}


def round_(m: BpfCleanupManager, *msgs: object) -> None:
    for msg in msgs:
        m.on_update(msg)
    m.apply()
    m.finish_apply()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def mounts_file(directory: Path, name: str, *bpffs_mount_points: Path | str) -> str:
    """A /proc/<pid>/mounts look-alike with bpf filesystems at the given points."""
    path = directory / name
    path.write_text("proc /proc proc rw,nosuid 0 0\n" + "".join(
        f"bpf {point} bpf rw,relatime 0 0\n" for point in bpffs_mount_points))
    return str(path)


def test_removes_ours_at_both_hooks_and_xdp_keeps_foreign_and_removes_pins(tmp_path):
    fake, pins = node(tmp_path)
    m = manager(fake, pins)
    removed_before = sample("pyfelix_bpf_cleanup_removed_total", kind="tc_filter")
    pins_before = sample("pyfelix_bpf_cleanup_removed_total", kind="pin")
    round_(m, p.InSync())
    for name in ("cali1", "cali2"):
        assert filters(fake, name) == {"ingress": [FOREIGN_BPF, FOREIGN_MATCHALL],
                                       "egress": [FOREIGN_LOOKALIKE]}
        assert fake.links[name].clsact  # left in place (see the module docstring)
    assert fake.links["eth0"].xdp_prog_id == 0
    assert fake.links["eth1"].xdp_prog_id == FOREIGN_XDP
    assert not pins.exists()
    assert m.last is not None
    assert (m.last.tc_filters, m.last.xdp_programs, m.last.interfaces, m.last.pins) == \
        (5, 1, 3, 3)
    assert m.last.pin_dir == str(pins) and m.last.left_in_pin_dir == []
    assert sample("pyfelix_bpf_cleanup_removed_total", kind="tc_filter") - removed_before == 5
    assert sample("pyfelix_bpf_cleanup_removed_total", kind="pin") - pins_before == 3
    assert fake.closed  # the netlink socket is not needed again


def test_nothing_before_in_sync_and_nothing_in_apply(tmp_path):
    fake, pins = node(tmp_path)
    m = manager(fake, pins)
    m.on_update(p.WorkloadEndpointRemove(p.WorkloadEndpointID("k8s", "default/a", "eth0")))
    m.apply()
    m.finish_apply()
    assert fake.calls == 0 and fake.mutations == 0 and pins.exists()
    m.on_update(p.InSync())
    m.apply()  # phase 1: the chains are not known to be in place yet
    assert fake.calls == 0 and fake.mutations == 0 and pins.exists()
    m.finish_apply()
    assert fake.mutations == 6 and not pins.exists()  # 5 filters, 1 XDP program


def test_one_successful_sweep_per_process_resyncs_do_not_repeat_it(tmp_path):
    fake, pins = node(tmp_path)
    clock = FakeClock()
    m = manager(fake, pins, clock)
    round_(m, p.InSync())
    calls = fake.calls
    assert fake.mutations == 6 and m.sweeps == 1 and m.next_attempt_at is None
    clock.advance(3600)
    round_(m)  # a later round: no kernel access at all
    m.request_resync()
    round_(m)  # nor at a resync: only a BPF-mode agent attaches our programs
    assert fake.calls == calls and m.sweeps == 1


def test_the_attacher_from_the_factory_is_closed_after_the_sweep_only(tmp_path):
    made: list[Attacher] = []

    def factory() -> Attacher:
        fake, _ = node(tmp_path / f"n{len(made)}")
        fake.fail_listing = not made  # the first one fails its link dump
        made.append(fake)
        return fake

    clock = FakeClock()
    m = BpfCleanupManager(None, attacher_factory=factory, clock=clock)
    round_(m, p.InSync())
    assert m.failed_sweeps == 1 and len(made) == 1 and not made[0].closed  # kept for the retry
    made[0].fail_listing = False
    clock.now = m.next_attempt_at
    round_(m)
    assert m.sweeps == 1 and len(made) == 1 and made[0].closed
    m.close()  # the daemon's shutdown: nothing left to close, no error
    assert len(made) == 1


def test_pin_dir_absent_and_no_pin_dir_are_fine(tmp_path):
    fake, pins = node(tmp_path)
    pins_gone = tmp_path / "never-created"
    round_(manager(fake, pins_gone), p.InSync())
    assert fake.links["eth0"].xdp_prog_id == 0
    fake2, _ = node(tmp_path / "second")
    m = BpfCleanupManager(None, attacher=fake2)
    round_(m, p.InSync())
    assert filters(fake2, "cali1")["ingress"] == [FOREIGN_BPF, FOREIGN_MATCHALL]
    assert pins.exists()  # nobody named it


def test_an_interface_that_vanished_is_not_an_error(tmp_path):
    fake, pins = node(tmp_path)
    fake.vanish_after_listing = {"cali2"}
    errors_before = sample("pyfelix_bpf_cleanup_errors_total")
    m = manager(fake, pins)
    round_(m, p.InSync())
    assert filters(fake, "cali1")["ingress"] == [FOREIGN_BPF, FOREIGN_MATCHALL]
    assert not pins.exists() and m.sweeps == 1
    assert sample("pyfelix_bpf_cleanup_errors_total") == errors_before


def test_vanishing_in_the_middle_of_an_interface(tmp_path):
    class GoneOnXdp(Attacher):
        def xdp_prog_id(self, ifindex: int) -> int:
            if ifindex == 11:
                raise InterfaceGone("ifindex 11: interface gone")
            return super().xdp_prog_id(ifindex)

    fake = GoneOnXdp()
    fake.add_link("cali1", 11).filters["ingress"] = [OURS_IN]
    m = BpfCleanupManager(None, attacher=fake)
    round_(m, p.InSync())
    assert m.sweeps == 1 and fake.links["cali1"].filters["ingress"] == []


def test_a_failed_detach_is_logged_counted_not_raised_and_retried_on_its_own_clock(
        tmp_path, caplog):
    fake, pins = node(tmp_path)
    fake.fail_delete_on = {11}
    errors_before = sample("pyfelix_bpf_cleanup_errors_total")
    clock = FakeClock()
    m = manager(fake, pins, clock)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        round_(m, p.InSync())  # does not raise
    assert any(r.levelno == logging.WARNING and "cali1: " in r.getMessage()
               and "EPERM" in r.getMessage() for r in caplog.records), caplog.text
    assert sample("pyfelix_bpf_cleanup_errors_total") - errors_before == 1
    # the other interfaces were cleaned; the pins wait until nothing of ours is attached
    assert filters(fake, "cali2")["egress"] == [FOREIGN_LOOKALIKE]
    assert fake.links["eth0"].xdp_prog_id == 0
    assert pins.exists() and m.sweeps == 0 and m.failed_sweeps == 1
    assert m.next_attempt_at == pytest.approx(clock.now + 1.0)
    assert not fake.closed
    fake.fail_delete_on = set()
    calls = fake.calls
    clock.advance(0.5)
    round_(m)  # not yet due: no kernel access
    assert fake.calls == calls and pins.exists()
    clock.now = m.next_attempt_at
    round_(m)  # due: no resync request needed for the retry
    assert filters(fake, "cali1")["ingress"] == [FOREIGN_BPF, FOREIGN_MATCHALL]
    assert not pins.exists() and m.sweeps == 1 and m.failed_sweeps == 0
    assert m.next_attempt_at is None and fake.closed


def test_the_backoff_doubles_from_1_s_to_at_most_300_s(tmp_path):
    fake, pins = node(tmp_path)
    fake.fail_listing = True
    clock = FakeClock()
    m = manager(fake, pins, clock)
    round_(m, p.InSync())
    delays = []
    for _ in range(12):
        assert m.next_attempt_at is not None
        delays.append(round(m.next_attempt_at - clock.now, 6))
        due = m.next_attempt_at
        clock.now = due - 0.001
        calls = fake.calls
        round_(m)
        assert fake.calls == calls  # before it is due: nothing
        clock.now = due
        round_(m)
        assert fake.calls == calls + 1  # due: one more (failing) link dump
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    assert m.failed_sweeps == 13 and m.sweeps == 0 and pins.exists()


def test_listing_failure_unpin_failure_and_a_bug_are_errors_never_raised(tmp_path):
    fake, pins = node(tmp_path)
    errors_before = sample("pyfelix_bpf_cleanup_errors_total")
    fake.fail_next = AttachError("dumping links: ENOBUFS")
    m = manager(fake, pins)
    round_(m, p.InSync())
    assert m.sweeps == 0 and m.failed_sweeps == 1 and pins.exists()

    def refuse(path: str) -> PinRemoval:
        raise PermissionError(13, "Permission denied", path)

    m2 = BpfCleanupManager(str(pins), attacher=fake, remove_pins=refuse,
                           locate_pins=lambda d: d, clock=FakeClock())
    round_(m2, p.InSync())
    assert m2.sweeps == 0 and m2.failed_sweeps == 1 and pins.exists()

    class Buggy(Attacher):
        def list_filters(self, ifindex: int, hook: str) -> list[TcFilter]:
            raise KeyError("a bug, or an exception the shim does not wrap")

    buggy = Buggy()
    buggy.add_link("cali1", 11)
    m3 = BpfCleanupManager(None, attacher=buggy, clock=FakeClock())
    round_(m3, p.InSync())
    assert m3.sweeps == 0 and m3.failed_sweeps == 1 and m3.next_attempt_at is not None
    assert sample("pyfelix_bpf_cleanup_errors_total") - errors_before == 3


class PolicyManager(ManagerBase):
    """Policy-critical: records the clock time of each apply that programmed a policy."""

    name = "policy"
    policy_critical = True

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.pending: list[str] = []
        self.applied: list[tuple[float, tuple[str, ...]]] = []

    def on_update(self, msg: object) -> None:
        if isinstance(msg, p.ActivePolicyUpdate):
            self.pending.append(msg.id.name)

    def apply(self) -> None:
        if self.pending:
            self.applied.append((self.clock.monotonic(), tuple(self.pending)))
            self.pending = []


def policy_update(name: str) -> p.ActivePolicyUpdate:
    return p.ActivePolicyUpdate(p.PolicyID("default", name), p.Policy())


def test_a_failing_sweep_delays_neither_policy_nor_readiness_in_the_real_loop(tmp_path):
    fake, pins = node(tmp_path)
    fake.fail_delete_on = {11}
    clock = FakeClock()
    cleanup = manager(fake, pins, clock)
    policy = PolicyManager(clock)
    loop = DataplaneLoop([policy, cleanup], clock=clock, resync_interval=90.0,
                         retry_initial=0.1, retry_max=30.0, fail_closed_after=5.0)
    loop_failures = sample("felix_int_dataplane_failures_total")
    loop.enqueue(policy_update("p0"))
    loop.enqueue(p.InSync())
    assert loop.run_once()
    assert loop.in_sync.is_set()  # readiness does not wait for the sweep...
    assert loop.consecutive_failures == 0 and loop.next_retry_at is None
    assert pins.exists() and fake.links["cali1"].filters["ingress"][0] == OURS_IN  # ...failed
    assert policy.applied == [(clock.now, ("p0",))]
    calls = fake.calls
    for n in range(1, 6):  # new policy within the loop's would-be backoff: applied at once
        clock.advance(0.05)
        loop.enqueue(policy_update(f"p{n}"))
        assert loop.run_once()
        assert policy.applied[-1] == (clock.now, (f"p{n}",))
    assert fake.calls == calls  # the sweep was not due yet: no kernel access
    assert cleanup.failed_sweeps == 1
    clock.advance(1.0)  # due now; retried at the next round, which the resync brings
    fake.fail_delete_on = set()
    assert not loop.run_once()  # nothing dirty: no round, no sweep
    assert cleanup.sweeps == 0
    clock.advance(90.0)
    assert loop.run_once()
    assert cleanup.sweeps == 1 and not pins.exists() and fake.closed
    assert not loop.fatal.is_set()
    assert sample("felix_int_dataplane_failures_total") == loop_failures


def test_remove_our_pins_unlinks_only_our_names_and_follows_nothing(tmp_path):
    pins = tmp_path / "pins"
    pins.mkdir()
    ours = [*OUR_PINS, "scratch_0123456789ab", "config_v1"]
    for name in ours:
        (pins / name).write_text("")
    (pins / "cilium_calls").write_text("foreign")  # a foreign pin
    (pins / "other").mkdir()  # a foreign subdirectory, with one of our names inside
    (pins / "other" / "rules_v1").write_text("")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "ipsets_v1").write_text("")
    (pins / "elsewhere").symlink_to(outside)  # a link to a directory outside
    (pins / "routes_v1").symlink_to(outside / "ipsets_v1")  # our name, but a link
    (pins / "progs_dir").mkdir()  # our prefix, but a directory
    removal = remove_our_pins(str(pins))
    assert sorted(removal.removed) == sorted(ours)
    assert removal.left == ["cilium_calls", "elsewhere", "other", "progs_dir", "routes_v1"]
    assert not removal.dir_removed
    assert sorted(os.listdir(pins)) == removal.left
    assert (pins / "cilium_calls").read_text() == "foreign"
    assert (pins / "other" / "rules_v1").exists()
    assert (outside / "ipsets_v1").exists() and os.listdir(outside) == ["ipsets_v1"]
    assert (pins / "elsewhere").is_symlink() and (pins / "routes_v1").is_symlink()


def test_remove_our_pins_removes_the_directory_only_when_empty(tmp_path):
    pins = tmp_path / "pins"
    pins.mkdir()
    for name in OUR_PINS:
        (pins / name).write_text("")
    assert remove_our_pins(str(pins)) == PinRemoval(sorted(OUR_PINS), [], True)
    assert not pins.exists()
    assert remove_our_pins(str(pins)) == PinRemoval()  # absent: nothing to do
    real = tmp_path / "real"
    real.mkdir()
    (real / "rules_v1").write_text("")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(OSError):  # given a link (locate_pin_dir resolves first): refused
        remove_our_pins(str(tmp_path / "link"))
    assert (real / "rules_v1").exists()


def test_foreign_entries_keep_the_pin_dir_with_a_warning_and_the_sweep_succeeds(
        tmp_path, caplog):
    fake, pins = node(tmp_path)
    (pins / "other_tool").mkdir()
    (pins / "cilium_calls").write_text("")
    m = manager(fake, pins)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        round_(m, p.InSync())
    assert m.sweeps == 1 and m.failed_sweeps == 0
    assert sorted(os.listdir(pins)) == ["cilium_calls", "other_tool"]
    assert m.last is not None and m.last.pins == 3 and m.last.pin_dir is None
    assert m.last.left_in_pin_dir == ["cilium_calls", "other_tool"]
    assert any("not ours" in r.getMessage() and "cilium_calls, other_tool" in r.getMessage()
               for r in caplog.records), caplog.text


def test_locate_pin_dir_resolves_links_and_refuses_a_bpffs_root(tmp_path):
    base = tmp_path.resolve()
    bpffs = base / "bpffs"
    (bpffs / "pyfelix").mkdir(parents=True)
    outside = base / "outside"
    outside.mkdir()
    views = [(mounts_file(base, "self-mounts", bpffs), "")]
    locate = functools.partial(locate_pin_dir, views=views)
    assert locate(str(bpffs / "pyfelix")) == str(bpffs / "pyfelix")
    assert locate(str(bpffs / "absent")) is None
    assert locate(str(outside)) is None  # not on bpffs: never emptied
    (base / "into").symlink_to(bpffs / "pyfelix")  # judged by where it leads
    assert locate(str(base / "into")) == str(bpffs / "pyfelix")
    (bpffs / "off").symlink_to(outside)  # on bpffs, leading off it: never touched
    assert locate(str(bpffs / "off")) is None
    (bpffs / "to-root").symlink_to(bpffs)
    (bpffs / "pyfelix" / "up").symlink_to("..")
    for root in (bpffs, f"{bpffs}/", bpffs / "to-root", bpffs / "pyfelix" / "up"):
        with pytest.raises(ValueError, match="root of a bpf filesystem"):
            locate(str(root))


def test_locate_pin_dir_through_the_hosts_view_refuses_links(tmp_path):
    base = tmp_path.resolve()
    host = base / "host"
    (host / "sys/fs/bpf/pyfelix").mkdir(parents=True)
    views = [(mounts_file(base, "self-mounts"), ""),  # ours: hidden by a private mount ns
             (mounts_file(base, "host-mounts", "/sys/fs/bpf"), str(host))]
    locate = functools.partial(locate_pin_dir, views=views)
    assert locate("/sys/fs/bpf/pyfelix") == f"{host}/sys/fs/bpf/pyfelix"
    assert locate("/sys/fs/bpf/absent") is None
    with pytest.raises(ValueError, match="root of a bpf filesystem"):
        locate("/sys/fs/bpf")
    (host / "sys/fs/bpf/to-root").symlink_to("/sys/fs/bpf")  # absolute: the host's root
    (host / "sys/fs/bpf/alias").symlink_to("pyfelix")
    for linked in ("/sys/fs/bpf/to-root", "/sys/fs/bpf/alias", "/sys/fs/bpf/alias/sub"):
        with pytest.raises(ValueError, match="symlink"):
            locate(linked)


def test_an_unreachable_host_view_means_nothing_to_remove(tmp_path, monkeypatch):
    # `ip netns exec` gives the agent another mount namespace, where /proc/1/root/... may
    # answer EACCES (root included): the sweep must carry on. Found in CI: an iptables
    # agent under `ip netns exec` logged a traceback and retried forever.
    base = tmp_path.resolve()
    host = base / "host"
    (host / "sys/fs/bpf/pyfelix").mkdir(parents=True)
    views = [(mounts_file(base, "self-mounts"), ""),
             (mounts_file(base, "host-mounts", "/sys/fs/bpf"), str(host))]
    real_lstat = os.lstat

    def denied(path, *args, **kwargs):
        if str(path).startswith(str(host / "sys")):
            raise PermissionError(13, "Permission denied", str(path))
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", denied)
    assert locate_pin_dir("/sys/fs/bpf/pyfelix", views=views) is None


def test_a_pin_dir_linked_to_the_bpffs_root_is_refused_and_nothing_there_touched(
        tmp_path, caplog):
    base = tmp_path.resolve()
    bpffs = base / "bpffs"
    bpffs.mkdir()
    for name in ("maps.debug", "rules_v1", "progs_0123456789ab"):  # even names like ours
        (bpffs / name).write_text("")
    (bpffs / "pyfelix").symlink_to(bpffs)
    views = [(mounts_file(base, "self-mounts", bpffs), "")]
    fake, _ = node(base / "n")
    m = BpfCleanupManager(str(bpffs / "pyfelix"), attacher=fake, clock=FakeClock(),
                          locate_pins=functools.partial(locate_pin_dir, views=views))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        round_(m, p.InSync())
    # refused with a warning, not an error; the programs were still detached
    assert m.sweeps == 1 and fake.links["eth0"].xdp_prog_id == 0
    assert sorted(os.listdir(bpffs)) == ["maps.debug", "progs_0123456789ab", "pyfelix",
                                         "rules_v1"]
    assert "root of a bpf filesystem" in caplog.text

def test_linux_managers_add_it_last_in_iptables_mode_with_a_pin_dir():
    def names(cfg: LinuxDataplaneConfig, **kw) -> list[str]:
        return [m.name for m in linux_managers(cfg, netns="unused-not-opened", **kw)]

    with_dir = LinuxDataplaneConfig(bpf_pin_dir="/sys/fs/bpf/pyfelix-x")
    assert names(with_dir)[-1] == "bpf-cleanup"
    assert names(with_dir, endpoint_status=lambda *a: None)[-2:] == \
        ["endpoint-status", "bpf-cleanup"]
    assert "bpf-cleanup" not in names(LinuxDataplaneConfig(bpf_pin_dir="/sys/fs/bpf/x",
                                                           bpf_mode=True))
    assert "bpf-cleanup" not in names(LinuxDataplaneConfig())
    from pyfelix.agent.config import load_config

    config = load_config(environ={"FELIX_BPFPINDIR": "/sys/fs/bpf/n1"})
    assert LinuxDataplaneConfig.from_config(config, bpf_mode=False).bpf_pin_dir == \
        "/sys/fs/bpf/n1"


def test_daemon_passes_bpf_pin_dir():
    from pyfelix.agent.config import load_config
    from pyfelix.agent.daemon import build_iptables_managers

    managers = build_iptables_managers(
        load_config(environ={"FELIX_BPFPINDIR": "/sys/fs/bpf/node7"}))
    assert managers[-1].name == "bpf-cleanup"
    assert managers[-1].pin_dir == "/sys/fs/bpf/node7"
    default = build_iptables_managers(load_config(environ={}))[-1]
    assert default.pin_dir == "/sys/fs/bpf/pyfelix"


NO_BCC_SCRIPT = textwrap.dedent("""
    import json, os, sys

    attempts = []

    class BlockBcc:
        def find_spec(self, name, path=None, target=None):
            if name == "bcc" or name.startswith("bcc."):
                attempts.append(name)
                raise ImportError("bcc is blocked by this test")
            return None

    sys.meta_path.insert(0, BlockBcc())
    sys.modules.pop("bcc", None)

    from pyfelix.agent import proto
    from pyfelix.agent.config import load_config
    from pyfelix.agent.daemon import select_managers
    from tests.bpf.fakes import FakeAttacher
    from pyfelix.agent.bpf.attach import TcFilter

    pin_dir = sys.argv[1]
    mode, managers = select_managers(load_config(environ={
        "FELIX_BPFENABLED": "false", "FELIX_BPFPINDIR": pin_dir}))
    cleanup = managers[-1]
    # the sweep's code path (detach + remove_our_pins) on a fake kernel
    fake = FakeAttacher()
    fake.add_link("cali1", 5).filters["ingress"] = [TcFilter(1, 1, "bpf", "pyfelix:x:1")]
    cleanup._attacher = fake
    cleanup._locate_pins = lambda d: d
    cleanup._remove_guard = lambda: False  # no nft in the test's (root) namespace
    cleanup.on_update(proto.InSync())
    cleanup.finish_apply()
    fallback_mode, fallback = select_managers(load_config(environ={
        "FELIX_BPFENABLED": "true", "FELIX_BPFFALLBACK": "iptables",
        "FELIX_BPFPINDIR": pin_dir + "-not-bpffs"}))
    print(json.dumps({"mode": mode, "last": cleanup.name, "attempts": attempts,
                      "bcc_loaded": sys.modules.get("bcc") is not None,
                      "filters_left": len(fake.links["cali1"].filters["ingress"]),
                      "pins_left": os.path.exists(pin_dir), "closed": fake.closed,
                      "fallback": [fallback_mode, fallback[-1].name]}))
""")


def test_iptables_mode_path_never_imports_bcc(tmp_path):
    pins = tmp_path / "pins"
    pins.mkdir()
    (pins / "rules_v1").write_text("")
    done = subprocess.run([sys.executable, "-c", NO_BCC_SCRIPT, str(pins)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"mode": "iptables", "last": "bpf-cleanup", "attempts": [],
                   "bcc_loaded": False, "filters_left": 0, "pins_left": False, "closed": True,
                   "fallback": ["iptables", "bpf-cleanup"]}
