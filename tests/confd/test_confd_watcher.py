"""The reconciler and loop, against a stateful fake BIRD: what ends up in the config file and
in the running BIRD, and what the counters say."""

from __future__ import annotations

import contextlib
import queue
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confd_fakes import (
    FakeBird,
    FakeSyncer,
    delete,
    doc_bgp_config,
    doc_block,
    doc_node,
    doc_pool,
    upd,
)
from prometheus_client import REGISTRY

from pyfelix.agent.syncer.api import SyncStatus
from pyfelix.confd.bird import BirdTools
from pyfelix.confd.watcher import ConfdLoop, ConfdReconciler, Outcome


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _staged_files(config_path: Path) -> list[Path]:
    """Temporary files confd left beside the config (it must leave none)."""
    return sorted(config_path.parent.glob(f".{config_path.name}.*"))


BASE = [doc_node("node1", "198.18.0.1/15"), doc_node("node2", "198.18.0.2/15"),
        doc_pool("pool", "10.65.0.0/16")]


@pytest.fixture()
def paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "etc" / "bird.conf", tmp_path / "bird.ctl"


def make(paths: tuple[Path, Path]) -> tuple[ConfdReconciler, FakeBird]:
    config_path, socket_path = paths
    bird = FakeBird(config_path)
    reconciler = ConfdReconciler("node1", config_path, socket_path,
                                 tools=bird)  # type: ignore[arg-type]
    return reconciler, bird


def synced(paths: tuple[Path, Path], docs: list[dict]) -> tuple[ConfdReconciler, FakeBird]:
    reconciler, bird = make(paths)
    reconciler.on_updates([upd(d) for d in docs])
    reconciler.on_status(SyncStatus.IN_SYNC)
    return reconciler, bird


def test_nothing_written_before_in_sync(paths: tuple[Path, Path]) -> None:
    reconciler, bird = make(paths)
    reconciler.on_status(SyncStatus.RESYNC)
    reconciler.on_updates([upd(d) for d in BASE])
    assert reconciler.reconcile() is Outcome.WAITING_FOR_SYNC
    assert not paths[0].exists()
    assert bird.running_config is None


def test_in_sync_writes_checked_config_and_reloads(paths: tuple[Path, Path]) -> None:
    reloads = counter("pyfelix_confd_reloads_total")
    reconciler, bird = synced(paths, BASE)
    assert reconciler.reconcile() is Outcome.RELOADED
    text = paths[0].read_text()
    assert bird.running_config == text == bird.checked[-1]
    assert "neighbor 198.18.0.2 as 64512;" in text
    assert stat.S_IMODE(paths[0].stat().st_mode) == 0o600  # may hold BGP passwords
    assert counter("pyfelix_confd_reloads_total") == reloads + 1
    assert _staged_files(paths[0]) == []


def test_unchanged_state_does_not_reload(paths: tuple[Path, Path]) -> None:
    reconciler, bird = synced(paths, BASE)
    reconciler.reconcile()
    reloads = counter("pyfelix_confd_reloads_total")
    reconciler.on_updates([upd(BASE[0])])  # same document again
    assert reconciler.reconcile() is Outcome.UNCHANGED
    reconciler.on_updates([upd(doc_block("unrelated", "node2", "10.65.2.0/26"))])
    assert reconciler.reconcile() is Outcome.UNCHANGED  # another node's block: same text
    assert counter("pyfelix_confd_reloads_total") == reloads
    assert len(bird.checked) == 1


def test_check_failure_keeps_running_config_counts_and_retries_on_next_change(
        paths: tuple[Path, Path]) -> None:
    reconciler, bird = synced(paths, BASE)
    reconciler.reconcile()
    good = paths[0].read_text()
    failures = counter("pyfelix_confd_bird_check_failures_total")
    bird.reject_when = lambda text: "10.65.1.0/26" in text
    reconciler.on_updates([upd(doc_block("b1", "node1", "10.65.1.0/26"))])
    assert reconciler.reconcile() is Outcome.CHECK_FAILED
    assert paths[0].read_text() == good
    assert bird.running_config == good
    assert _staged_files(paths[0]) == []
    assert "bird -p rejected" in reconciler.last_error
    assert counter("pyfelix_confd_bird_check_failures_total") == failures + 1
    # no change: no retry
    assert reconciler.reconcile() is Outcome.UNCHANGED
    # the next change is tried again (and now BIRD accepts it)
    bird.reject_when = lambda text: False
    reconciler.on_updates([upd(doc_node("node3", "198.18.0.3/15"))])
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "route 10.65.1.0/26 blackhole;" in (bird.running_config or "")
    assert "neighbor 198.18.0.3 as 64512;" in (bird.running_config or "")


def test_reload_failure_is_retried_until_bird_answers(paths: tuple[Path, Path]) -> None:
    reconciler, bird = synced(paths, BASE)
    bird.down = True
    failures = counter("pyfelix_confd_reload_failures_total")
    assert reconciler.reconcile() is Outcome.RELOAD_FAILED
    assert paths[0].exists()  # checked and installed: a BIRD starting now reads it
    assert reconciler.reconcile() is Outcome.RELOAD_FAILED
    assert counter("pyfelix_confd_reload_failures_total") == failures + 2
    bird.down = False
    assert reconciler.reconcile() is Outcome.RELOADED
    assert bird.running_config == paths[0].read_text()
    assert reconciler.reconcile() is Outcome.UNCHANGED


def test_render_failure_keeps_running_config(paths: tuple[Path, Path]) -> None:
    reconciler, bird = synced(paths, BASE)
    reconciler.reconcile()
    good = bird.running_config
    failures = counter("pyfelix_confd_render_failures_total")
    reconciler.on_updates([delete(BASE[0])])  # our own Node disappears
    assert reconciler.reconcile() is Outcome.RENDER_FAILED
    assert "Node(node1)" in reconciler.last_error
    assert bird.running_config == good == paths[0].read_text()
    assert counter("pyfelix_confd_render_failures_total") == failures + 1
    reconciler.on_updates([upd(BASE[0])])
    assert reconciler.reconcile() is Outcome.UNCHANGED  # back to the running text


def test_invalid_global_config_keeps_running_config(paths: tuple[Path, Path]) -> None:
    reconciler, bird = synced(paths, [*BASE, doc_bgp_config(nodeToNodeMeshEnabled=False)])
    reconciler.reconcile()
    assert "protocol bgp" not in (bird.running_config or "")
    reconciler.on_updates([upd(doc_bgp_config(nodeToNodeMeshEnabled=False, listenPort=0))])
    assert reconciler.reconcile() is Outcome.RENDER_FAILED
    assert "protocol bgp" not in (bird.running_config or "")  # the mesh did not come back


def test_real_bird_check_rejects_what_bird_cannot_parse(paths: tuple[Path, Path],
                                                        tmp_path: Path) -> None:
    if shutil.which("bird") is None:
        pytest.skip("bird not installed")
    good = tmp_path / "good.conf"
    good.write_text("router id 198.18.0.1;\nprotocol device { }\n")
    bad = tmp_path / "bad.conf"
    bad.write_text("router id 198.18.0.1;\nprotocol nonsense { }\n")
    tools = BirdTools()
    assert tools.check(good).ok
    result = tools.check(bad)
    assert not result.ok and "bad.conf:2" in result.message


def test_configure_without_bird_fails_with_the_reason(tmp_path: Path) -> None:
    if shutil.which("birdc") is None:
        pytest.skip("birdc not installed")
    result = BirdTools().configure(tmp_path / "nobody.ctl")
    assert not result.ok
    assert "nobody.ctl" in result.message


def next_outcome(outcomes: queue.Queue[Outcome]) -> Outcome:
    """The next outcome that is not "still waiting for the first in-sync"."""
    while True:
        outcome = outcomes.get(timeout=5)
        if outcome is not Outcome.WAITING_FOR_SYNC:
            return outcome


@contextlib.contextmanager
def running_loop(reconciler: ConfdReconciler,
                 **options: Any) -> Iterator[tuple[FakeSyncer, queue.Queue[Outcome]]]:
    """A started ConfdLoop (debounce 0.01 s) on a FakeSyncer whose callbacks are set; yields
    the syncer and the loop's outcomes; the loop is stopped when the block ends."""
    syncer = FakeSyncer()
    outcomes: queue.Queue[Outcome] = queue.Queue()
    loop = ConfdLoop(syncer, reconciler, debounce=0.01, on_outcome=outcomes.put, **options)
    loop.start()
    try:
        deadline = time.monotonic() + 5
        while syncer.callbacks is None and time.monotonic() < deadline:
            time.sleep(0.01)
        yield syncer, outcomes
    finally:
        loop.stop()


def outcome_after(outcomes: queue.Queue[Outcome], repeated: Outcome) -> Outcome:
    """The first outcome that is not `repeated` (a failure the loop keeps retrying)."""
    while (outcome := next_outcome(outcomes)) is repeated:
        pass
    return outcome


def test_loop_reloads_after_in_sync_and_on_each_change(paths: tuple[Path, Path]) -> None:
    reconciler, bird = make(paths)
    with running_loop(reconciler, max_delay=0.1) as (syncer, outcomes):
        syncer.status(SyncStatus.RESYNC)
        syncer.send(*BASE)
        syncer.status(SyncStatus.IN_SYNC)
        assert next_outcome(outcomes) is Outcome.RELOADED
        syncer.send(doc_block("b1", "node1", "10.65.1.0/26"))
        assert next_outcome(outcomes) is Outcome.RELOADED
        assert "route 10.65.1.0/26 blackhole;" in (bird.running_config or "")
    assert syncer.stopped


def test_loop_retries_a_failed_reload_without_a_new_change(paths: tuple[Path, Path]) -> None:
    reconciler, bird = make(paths)
    bird.down = True
    with running_loop(reconciler, reload_retry_interval=0.05) as (syncer, outcomes):
        syncer.send(*BASE)
        syncer.status(SyncStatus.IN_SYNC)
        assert next_outcome(outcomes) is Outcome.RELOAD_FAILED
        bird.down = False
        assert outcome_after(outcomes, Outcome.RELOAD_FAILED) is Outcome.RELOADED
        assert bird.running_config == paths[0].read_text()


def test_loop_survives_an_unexpected_error_and_retries(paths: tuple[Path, Path]) -> None:
    reconciler, bird = make(paths)
    blocker = paths[0].parent
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file where the config directory should be")  # staging fails
    with running_loop(reconciler, reload_retry_interval=0.05) as (syncer, outcomes):
        syncer.send(*BASE)
        syncer.status(SyncStatus.IN_SYNC)
        assert next_outcome(outcomes) is Outcome.ERROR
        blocker.unlink()
        assert outcome_after(outcomes, Outcome.ERROR) is Outcome.RELOADED
        assert bird.running_config == paths[0].read_text()
