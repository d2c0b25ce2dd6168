"""FileSyncer against a real temporary directory, in inotify and polling modes.

Each test waits (bounded) for the expected state; "nothing was sent" is checked with a
sentinel: a later change whose arrival proves the earlier one was processed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from syncer_testlib import gnp, gnp_key, netpol, settle, write, yaml_docs

from pyfelix.agent.syncer import file as file_module
from pyfelix.agent.syncer.api import ResourceKey, SyncStatus
from pyfelix.agent.syncer.file import FileSyncer
from pyfelix.agent.syncer.inotify import InotifyUnavailable


def test_status_sequence_and_initial_snapshot(tmp_path: Path, start_syncer, watch_mode) -> None:
    write(tmp_path / "a.yaml", yaml_docs(gnp("a"), netpol("n", "ns")))
    write(tmp_path / "sub" / "b.yaml", yaml_docs(gnp("b")))
    syncer, rec = start_syncer(tmp_path)
    rec.wait_in_sync()
    assert rec.events == [("status", SyncStatus.WAIT_FOR_DATASTORE),
                          ("status", SyncStatus.RESYNC), ("updates", 3),
                          ("status", SyncStatus.IN_SYNC)]
    assert set(rec.state) == {gnp_key("a"), gnp_key("b"), ResourceKey("NetworkPolicy", "ns", "n")}
    assert syncer.mode == watch_mode


def test_waits_for_a_missing_datastore(tmp_path: Path, start_syncer) -> None:
    root = tmp_path / "later"
    _, rec = start_syncer(root)
    rec.wait_for(lambda r: r.statuses == [SyncStatus.WAIT_FOR_DATASTORE], "wait status")
    write(root / "x.yaml", yaml_docs(gnp("x")))
    rec.wait_in_sync()
    assert rec.statuses == [SyncStatus.WAIT_FOR_DATASTORE, SyncStatus.RESYNC, SyncStatus.IN_SYNC]
    # the directory may appear a moment before its file: then the file arrives as a change
    rec.wait_for(lambda r: set(r.state) == {gnp_key("x")}, "file in the new datastore")


def test_add_edit_remove_document_and_delete_file(tmp_path: Path, start_syncer) -> None:
    write(tmp_path / "a.yaml", yaml_docs(gnp("a1"), gnp("a2")))
    _, rec = start_syncer(tmp_path)
    rec.wait_in_sync()

    write(tmp_path / "new.yaml", yaml_docs(gnp("n1")))
    rec.wait_for(lambda r: gnp_key("n1") in r.state, "added file")

    since = len(rec.updates())
    write(tmp_path / "a.yaml", yaml_docs(gnp("a1"), gnp("a2", "role == 'db'")))
    rec.wait_for(lambda r: r.state[gnp_key("a2")] == gnp("a2", "role == 'db'"), "edited doc")
    changed = settle(rec, tmp_path, "edit", since)
    assert [u.key for u in changed] == [gnp_key("a2")]  # a1 unchanged: nothing sent for it

    write(tmp_path / "a.yaml", yaml_docs(gnp("a2", "role == 'db'")))
    rec.wait_for(lambda r: gnp_key("a1") not in r.state, "doc removed from file")
    assert rec.updates()[-1].key == gnp_key("a1") and rec.updates()[-1].value is None

    (tmp_path / "a.yaml").unlink()
    rec.wait_for(lambda r: gnp_key("a2") not in r.state, "file deleted")
    assert set(rec.state) == {gnp_key("n1"), gnp_key("sentinel-edit")}
    assert rec.errors == []


def test_rename_and_move_between_files_send_nothing(tmp_path: Path, start_syncer) -> None:
    write(tmp_path / "a.yaml", yaml_docs(gnp("p"), gnp("q")))
    (tmp_path / "sub").mkdir()
    _, rec = start_syncer(tmp_path)
    rec.wait_in_sync()
    since = len(rec.updates())
    os.rename(tmp_path / "a.yaml", tmp_path / "sub" / "renamed.yaml")
    assert settle(rec, tmp_path, "rename", since) == []
    assert set(rec.state) >= {gnp_key("p"), gnp_key("q")}


def test_broken_edit_keeps_last_good_state_then_fix_applies(tmp_path: Path,
                                                            start_syncer) -> None:
    path = tmp_path / "p.yaml"
    write(path, yaml_docs(gnp("p1"), gnp("p2")))
    _, rec = start_syncer(tmp_path)
    rec.wait_in_sync()
    before = REGISTRY.get_sample_value("pyfelix_datastore_parse_errors_total",
                                       {"backend": "file"}) or 0.0
    since = len(rec.updates())

    write(path, yaml_docs(gnp("p1")) + "---\nkind: GlobalNetworkPolicy\nmetadata: {name: [\n")
    rec.wait_for(lambda r: len(r.errors) == 1, "parse error")
    assert settle(rec, tmp_path, "broken", since) == []  # no deletes for p1/p2
    assert {gnp_key("p1"), gnp_key("p2")} <= set(rec.state)
    error = rec.errors[0]
    assert error.source == f"{path}#2" and "invalid YAML" in error.message
    after = REGISTRY.get_sample_value("pyfelix_datastore_parse_errors_total",
                                      {"backend": "file"})
    assert after == before + 1

    # written in place (truncate, then write): a writer stalled longer than the debounce
    # between the two lets the syncer read the empty file first, so wait for the end state
    # rather than for the first sign of the new contents
    write(path, yaml_docs(gnp("p1", "fixed == 'yes'")))
    rec.wait_for(lambda r: gnp_key("p2") not in r.state
                 and r.state.get(gnp_key("p1")) == gnp("p1", "fixed == 'yes'"), "fix applied")
    assert len(rec.errors) == 1


def test_unkeyable_edit_drops_only_that_document(tmp_path: Path, start_syncer) -> None:
    path = tmp_path / "p.yaml"
    write(path, yaml_docs(gnp("p1"), gnp("p2")))
    _, rec = start_syncer(tmp_path)
    rec.wait_in_sync()
    write(path, yaml_docs(gnp("p1"), {"kind": "GlobalNetworkPolicy", "metadata": {"nam": "p2"}}))
    rec.wait_for(lambda r: gnp_key("p2") not in r.state and len(r.errors) == 1, "unkeyable")
    assert gnp_key("p1") in rec.state
    assert rec.errors[0].source == f"{path}#2" and "metadata.name" in rec.errors[0].message


def test_new_subdirectories_and_directory_moves(tmp_path: Path, start_syncer) -> None:
    _, rec = start_syncer(tmp_path)
    rec.wait_in_sync()
    write(tmp_path / "d1" / "d2" / "deep.yaml", yaml_docs(gnp("deep")))
    rec.wait_for(lambda r: gnp_key("deep") in r.state, "file in new nested directory")
    write(tmp_path / "d1" / "d2" / "later.yaml", yaml_docs(gnp("later")))
    rec.wait_for(lambda r: gnp_key("later") in r.state, "file added in watched subdirectory")

    since = len(rec.updates())
    os.rename(tmp_path / "d1", tmp_path / "moved")
    assert settle(rec, tmp_path, "dirmove", since) == []
    write(tmp_path / "moved" / "d2" / "after-move.yaml", yaml_docs(gnp("after-move")))
    rec.wait_for(lambda r: gnp_key("after-move") in r.state, "file in moved directory")

    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    os.rename(tmp_path / "moved", outside)
    try:
        rec.wait_for(lambda r: not ({gnp_key("deep"), gnp_key("later")} & set(r.state)),
                     "directory moved out")
        since = len(rec.updates())
        write(outside / "d2" / "ghost.yaml", yaml_docs(gnp("ghost")))
        assert settle(rec, tmp_path, "outside", since) == []
    finally:
        for path in sorted(outside.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        outside.rmdir()


def test_editor_writing_in_steps_is_debounced(tmp_path: Path, start_syncer) -> None:
    path = tmp_path / "p.yaml"
    write(path, yaml_docs(gnp("p")))
    _, rec = start_syncer(tmp_path, debounce=0.3)
    rec.wait_in_sync()
    final = yaml_docs(gnp("p", "step == 'two'"))
    with open(path, "w") as handle:  # truncate, write half (invalid YAML), then the rest
        handle.write(final[:30] + "\n  [")
        handle.flush()
        time.sleep(0.01)
        handle.seek(0)
        handle.truncate()
        handle.write(final)
    rec.wait_for(lambda r: r.state.get(gnp_key("p")) == gnp("p", "step == 'two'"), "final")
    assert rec.errors == []


def test_kubernetes_configmap_style_symlink_swap(tmp_path: Path, start_syncer) -> None:
    (tmp_path / "..v1").mkdir()
    write(tmp_path / "..v1" / "policy.yaml", yaml_docs(gnp("cm", "v == '1'")))
    os.symlink("..v1", tmp_path / "..data")
    os.symlink("..data/policy.yaml", tmp_path / "policy.yaml")
    _, rec = start_syncer(tmp_path)
    rec.wait_in_sync()
    assert rec.state[gnp_key("cm")] == gnp("cm", "v == '1'")
    # the atomic writer: new hidden dir, new ..data link renamed over the old one
    (tmp_path / "..v2").mkdir()
    write(tmp_path / "..v2" / "policy.yaml", yaml_docs(gnp("cm", "v == '2'")))
    os.symlink("..v2", tmp_path / "..data_tmp")
    os.rename(tmp_path / "..data_tmp", tmp_path / "..data")
    rec.wait_for(lambda r: r.state[gnp_key("cm")] == gnp("cm", "v == '2'"), "swapped data")


def test_datastore_directory_removed_and_recreated(tmp_path: Path, start_syncer) -> None:
    root = tmp_path / "store"
    write(root / "a.yaml", yaml_docs(gnp("a")))
    _, rec = start_syncer(root)
    rec.wait_in_sync()
    (root / "a.yaml").unlink()
    root.rmdir()
    rec.wait_for(lambda r: r.state == {}, "everything deleted")
    write(root / "b.yaml", yaml_docs(gnp("b")))
    rec.wait_for(lambda r: set(r.state) == {gnp_key("b")}, "recreated datastore read")
    write(root / "c.yaml", yaml_docs(gnp("c")))
    rec.wait_for(lambda r: gnp_key("c") in r.state, "watching the recreated directory")


def test_single_file_datastore_replaced_atomically(tmp_path: Path, start_syncer) -> None:
    path = tmp_path / "cluster.yaml"
    write(path, yaml_docs(gnp("s1"), gnp("s2")))
    write(tmp_path / "neighbour.yaml", yaml_docs(gnp("not-part-of-it")))
    _, rec = start_syncer(path)
    rec.wait_in_sync()
    assert set(rec.state) == {gnp_key("s1"), gnp_key("s2")}
    temporary = tmp_path / ".cluster.yaml.tmp"
    write(temporary, yaml_docs(gnp("s2"), gnp("s3")))
    os.replace(temporary, path)
    rec.wait_for(lambda r: set(r.state) == {gnp_key("s2"), gnp_key("s3")}, "replaced file")
    path.unlink()
    rec.wait_for(lambda r: r.state == {}, "file deleted")


def test_duplicate_across_files_warns_and_later_path_wins(tmp_path: Path,
                                                          start_syncer) -> None:
    write(tmp_path / "a.yaml", yaml_docs(gnp("dup", "from == 'a'")))
    _, rec = start_syncer(tmp_path)
    rec.wait_in_sync()
    write(tmp_path / "b.yaml", yaml_docs(gnp("dup", "from == 'b'")))
    rec.wait_for(lambda r: r.state[gnp_key("dup")] == gnp("dup", "from == 'b'"), "b wins")
    rec.wait_for(lambda r: len(r.errors) == 1, "duplicate warning")
    assert "defined more than once" in rec.errors[0].message
    (tmp_path / "b.yaml").unlink()
    rec.wait_for(lambda r: r.state[gnp_key("dup")] == gnp("dup", "from == 'a'"), "a again")


def test_inotify_unavailable_falls_back_to_polling(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    class NoInotify:
        def __init__(self) -> None:
            raise InotifyUnavailable(24, "too many inotify instances")

    monkeypatch.setattr(file_module, "Inotify", NoInotify)
    from syncer_testlib import Recorder

    syncer = FileSyncer(tmp_path, poll_interval=0.05)
    rec = Recorder()
    syncer.start(rec)
    try:
        rec.wait_in_sync()
        assert syncer.mode == "poll"
        write(tmp_path / "x.yaml", yaml_docs(gnp("x")))
        rec.wait_for(lambda r: gnp_key("x") in r.state, "polled change")
    finally:
        syncer.stop()


def test_stop_is_prompt_and_idempotent(tmp_path: Path, start_syncer) -> None:
    syncer, rec = start_syncer(tmp_path, poll_interval=30.0, rescan_interval=30.0)
    rec.wait_in_sync()
    started = time.monotonic()
    syncer.stop()
    syncer.stop()
    assert time.monotonic() - started < 5.0
