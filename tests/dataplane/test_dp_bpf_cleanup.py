"""BpfCleanupManager (iptables mode) on a stateful FakeAttacher and a temporary pin dir:
ours removed at both hooks and from XDP, every foreign filter and XDP program kept, nothing
before InSync, one successful sweep per process (resyncs do not repeat it), a vanished
interface tolerated, failures counted and
raised (pins kept until every detach worked) and retried by the real loop without failing
closed; the wiring in linux_managers / the daemon, and no `bcc` import on that path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from agent import proto as p
from agent.bpf.attach import AttachError, InterfaceGone, TcFilter, filter_name
from agent.dataplane.linux import LinuxDataplaneConfig, linux_managers
from agent.dataplane.loop import DataplaneLoop
from agent.dataplane.managers import bpf_cleanup
from agent.dataplane.managers.bpf_cleanup import BpfCleanupError, BpfCleanupManager
from tests.bpf.fakes import FakeAttacher
from tests.fakes.clock import FakeClock

REPO = Path(__file__).resolve().parents[2]

OURS_IN = TcFilter(1, 1, "bpf", filter_name("calico_from_wep", 501))
OURS_OUT = TcFilter(1, 1, "bpf", filter_name("calico_to_wep", 502))
OURS_OLD_BUILD = TcFilter(3, 7, "bpf", filter_name("calico_from_wep", 400))
FOREIGN_BPF = TcFilter(5, 1, "bpf", "cilium-like")
FOREIGN_LOOKALIKE = TcFilter(6, 1, "bpf", "pyfelix-but-not-ours")
FOREIGN_MATCHALL = TcFilter(7, 1, "matchall", "pyfelix:not-a-bpf-filter")
OUR_XDP, FOREIGN_XDP = 503, 600


class Attacher(FakeAttacher):
    """FakeAttacher that counts calls, can make one interface vanish after the link dump,
    and can fail deletes on chosen ifindexes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.vanish_after_listing: set[str] = set()
        self.fail_delete_on: set[int] = set()

    def list_links(self) -> dict[str, int]:
        self.calls += 1
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
    for name in ("ipsets_v1", "rules_v1", "progs_0123456789ab"):
        (pins / name).write_text("")
    return fake, pins


def manager(fake: Attacher, pins: Path) -> BpfCleanupManager:
    return BpfCleanupManager(str(pins), attacher=fake,
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
    assert sample("pyfelix_bpf_cleanup_removed_total", kind="tc_filter") - removed_before == 5
    assert sample("pyfelix_bpf_cleanup_removed_total", kind="pin") - pins_before == 3


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
    m = manager(fake, pins)
    round_(m, p.InSync())
    calls = fake.calls
    assert fake.mutations == 6 and m.sweeps == 1
    round_(m)  # a later round: no kernel access at all
    m.request_resync()
    round_(m)  # nor at a resync: only a BPF-mode agent attaches our programs
    assert fake.calls == calls and m.sweeps == 1


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
    round_(m, p.InSync())  # does not raise
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


def test_a_failed_detach_is_counted_raised_keeps_the_pins_and_is_retried(tmp_path):
    fake, pins = node(tmp_path)
    fake.fail_delete_on = {11}
    errors_before = sample("pyfelix_bpf_cleanup_errors_total")
    m = manager(fake, pins)
    with pytest.raises(BpfCleanupError, match=r"cali1: .*EPERM"):
        round_(m, p.InSync())
    assert sample("pyfelix_bpf_cleanup_errors_total") - errors_before == 1
    # the other interfaces were cleaned; the pins wait until nothing of ours is attached
    assert filters(fake, "cali2")["egress"] == [FOREIGN_LOOKALIKE]
    assert fake.links["eth0"].xdp_prog_id == 0
    assert pins.exists() and m.sweeps == 0
    fake.fail_delete_on = set()
    m.apply()
    m.finish_apply()  # still due: no resync request needed for the retry
    assert filters(fake, "cali1")["ingress"] == [FOREIGN_BPF, FOREIGN_MATCHALL]
    assert not pins.exists() and m.sweeps == 1


def test_listing_failure_and_unpin_failure_are_errors(tmp_path):
    fake, pins = node(tmp_path)
    fake.fail_next = AttachError("dumping links: ENOBUFS")
    m = manager(fake, pins)
    with pytest.raises(BpfCleanupError, match="listing interfaces"):
        round_(m, p.InSync())

    def refuse(path: str) -> None:
        raise PermissionError(13, "Permission denied", path)

    m2 = BpfCleanupManager(str(pins), attacher=fake, remove_pins=refuse,
                           locate_pins=lambda d: d)
    with pytest.raises(BpfCleanupError, match="removing pin directory"):
        round_(m2, p.InSync())
    assert pins.exists()


def test_the_loop_retries_with_backoff_and_never_fails_closed(tmp_path):
    fake, pins = node(tmp_path)
    fake.fail_delete_on = {11}
    clock = FakeClock()
    m = manager(fake, pins)
    loop = DataplaneLoop([m], clock=clock, fail_closed_after=5.0, retry_max=1.0)
    loop.enqueue(p.InSync())
    assert loop.run_once()
    assert loop.consecutive_failures == 1 and loop.next_retry_at is not None
    assert not loop.in_sync.is_set()
    for _ in range(20):  # well past fail_closed_after: not policy-critical
        clock.advance(1.5)
        loop.run_once()
    assert not loop.fatal.is_set() and loop.consecutive_failures > 5
    fake.fail_delete_on = set()
    clock.advance(1.5)
    assert loop.run_once()
    assert loop.in_sync.is_set() and loop.consecutive_failures == 0 and not pins.exists()


def test_locate_pin_dir_only_on_bpffs_never_its_root(tmp_path, monkeypatch):
    pins = tmp_path / "pins"
    pins.mkdir()
    assert bpf_cleanup.locate_pin_dir(str(pins)) is None  # tmp is not bpffs: never emptied

    mounts = {"/proc/self/mounts": None, "/proc/1/mounts": str(tmp_path)}
    monkeypatch.setattr(bpf_cleanup, "bpffs_mount_of", lambda path, f: mounts[f])
    host_root = tmp_path / "host"
    (host_root / str(pins).lstrip("/")).mkdir(parents=True)
    monkeypatch.setattr(bpf_cleanup, "HOST_ROOT", str(host_root))
    # hidden by a private mount namespace: the host's view through /proc/1/root
    assert bpf_cleanup.locate_pin_dir(str(pins)) == f"{host_root}{pins}"
    mounts["/proc/self/mounts"] = str(tmp_path)
    assert bpf_cleanup.locate_pin_dir(str(pins)) == str(pins)
    assert bpf_cleanup.locate_pin_dir(str(tmp_path / "absent")) is None
    with pytest.raises(ValueError, match="root of a bpf filesystem"):
        bpf_cleanup.locate_pin_dir(str(tmp_path))
    # the manager refuses it with a warning, not an error, and still detaches programs
    fake, _ = node(tmp_path / "n")
    m = BpfCleanupManager(str(tmp_path), attacher=fake)
    round_(m, p.InSync())
    assert pins.exists() and m.sweeps == 1 and fake.links["eth0"].xdp_prog_id == 0


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
    assert LinuxDataplaneConfig.from_felix({"BPFPinDir": "/sys/fs/bpf/n1"}).bpf_pin_dir == \
        "/sys/fs/bpf/n1"


def test_daemon_passes_bpf_pin_dir():
    from agent.config import load_config
    from agent.daemon import linux_config

    cfg = linux_config(load_config(environ={"FELIX_BPFPINDIR": "/sys/fs/bpf/node7"}),
                       bpf_mode=False)
    assert cfg.bpf_pin_dir == "/sys/fs/bpf/node7"
    assert linux_config(load_config(environ={}), bpf_mode=False).bpf_pin_dir == \
        "/sys/fs/bpf/pyfelix"


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

    from agent import proto
    from agent.config import load_config
    from agent.daemon import select_managers
    from tests.bpf.fakes import FakeAttacher
    from agent.bpf.attach import TcFilter

    pin_dir = sys.argv[1]
    mode, managers = select_managers(load_config(environ={
        "FELIX_BPFENABLED": "false", "FELIX_BPFPINDIR": pin_dir}))
    cleanup = managers[-1]
    # the sweep's code path (detach + the loader's remove_pin_dir) on a fake kernel
    fake = FakeAttacher()
    fake.add_link("cali1", 5).filters["ingress"] = [TcFilter(1, 1, "bpf", "pyfelix:x:1")]
    cleanup._attacher = fake
    cleanup._locate_pins = lambda d: d
    cleanup.on_update(proto.InSync())
    cleanup.finish_apply()
    fallback_mode, fallback = select_managers(load_config(environ={
        "FELIX_BPFENABLED": "true", "FELIX_BPFFALLBACK": "iptables",
        "FELIX_BPFPINDIR": pin_dir + "-not-bpffs"}))
    print(json.dumps({"mode": mode, "last": cleanup.name, "attempts": attempts,
                      "bcc_loaded": sys.modules.get("bcc") is not None,
                      "filters_left": len(fake.links["cali1"].filters["ingress"]),
                      "pins_left": os.path.exists(pin_dir),
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
                   "bcc_loaded": False, "filters_left": 0, "pins_left": False,
                   "fallback": ["iptables", "bpf-cleanup"]}
