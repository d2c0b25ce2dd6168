"""BGP passwords from v1 Secrets through the reconciler: the value reaches bird.conf (mode
0600) and nothing else (logs, notes, errors, repr); a changed Secret reloads BIRD; a
missing Secret or key leaves the peer out (fail closed) with a message naming the peer and
the Secret."""

from __future__ import annotations

import base64
import logging
import stat
from pathlib import Path
from typing import Any

import pytest
from confd_fakes import FakeBird, delete, doc_node, doc_peer, doc_pool, upd

from pyfelix.agent.syncer.api import SyncStatus
from pyfelix.confd.watcher import ConfdReconciler, Outcome

FIRST = "first-Pw-9c1e"
SECOND = "second-Pw-44d0"
BASE = [doc_node("node1", "198.18.0.1/15"), doc_node("node2", "198.18.0.2/15"),
        doc_pool("pool", "10.65.0.0/16"),
        doc_peer("tor", peerIP="198.19.0.1", asNumber=65001,
                 password={"secretKeyRef": {"name": "bgp-secrets", "key": "tor"}})]


def secret(value: str, *, namespace: str = "calico-system", key: str = "tor",
           encoded: bool = True) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret",
                           "metadata": {"name": "bgp-secrets", "namespace": namespace}}
    if encoded:
        doc["data"] = {key: base64.b64encode(value.encode()).decode()}
    else:
        doc["stringData"] = {key: value}
    return doc


@pytest.fixture()
def setup(tmp_path: Path, caplog: pytest.LogCaptureFixture
          ) -> tuple[ConfdReconciler, FakeBird, Path]:
    caplog.set_level(logging.DEBUG)
    config_path = tmp_path / "etc" / "bird.conf"
    bird = FakeBird(config_path)
    reconciler = ConfdReconciler("node1", config_path, tmp_path / "bird.ctl",
                                 tools=bird,  # type: ignore[arg-type]
                                 secret_namespace="calico-system")
    return reconciler, bird, config_path


def _no_secret_outside_config(caplog: pytest.LogCaptureFixture,
                              reconciler: ConfdReconciler) -> None:
    for value in (FIRST, SECOND):
        assert value not in caplog.text
        assert value not in reconciler.last_error
        assert value not in repr(reconciler.view.snapshot())


def test_secret_password_rendered_reloaded_on_change_and_never_logged(
        setup: tuple[ConfdReconciler, FakeBird, Path],
        caplog: pytest.LogCaptureFixture) -> None:
    reconciler, bird, config_path = setup
    reconciler.on_updates([upd(d) for d in BASE] + [upd(secret(FIRST))])
    reconciler.on_status(SyncStatus.IN_SYNC)
    assert reconciler.reconcile() is Outcome.RELOADED
    assert f'password "{FIRST}";' in bird.running_config
    assert stat.S_IMODE(config_path.stat().st_mode) == 0o600

    # the Secret changes (stringData this time): new config, BIRD reloaded
    reconciler.on_updates([upd(secret(SECOND, encoded=False))])
    assert reconciler.reconcile() is Outcome.RELOADED
    assert f'password "{SECOND}";' in bird.running_config
    assert FIRST not in bird.running_config
    assert stat.S_IMODE(config_path.stat().st_mode) == 0o600

    # a Secret of the same name in another namespace changes nothing
    reconciler.on_updates([upd(secret(FIRST, namespace="default"))])
    assert reconciler.reconcile() is Outcome.UNCHANGED
    assert f'password "{SECOND}";' in bird.running_config
    _no_secret_outside_config(caplog, reconciler)


def test_missing_secret_or_key_fails_closed_and_names_peer_and_secret(
        setup: tuple[ConfdReconciler, FakeBird, Path],
        caplog: pytest.LogCaptureFixture) -> None:
    reconciler, bird, _config_path = setup
    reconciler.on_updates([upd(d) for d in BASE])
    reconciler.on_status(SyncStatus.IN_SYNC)
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "neighbor 198.19.0.1" not in bird.running_config
    assert ("BGPPeer(tor): spec.password.secretKeyRef: Secret calico-system/bgp-secrets "
            "not found") in caplog.text
    assert "peer not rendered (no session without its password)" in caplog.text

    reconciler.on_updates([upd(secret(FIRST))])
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "neighbor 198.19.0.1 as 65001;" in bird.running_config
    assert f'password "{FIRST}";' in bird.running_config

    # the key goes away: the session goes with it (never kept without its password)
    reconciler.on_updates([upd(secret(FIRST, key="other"))])
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "neighbor 198.19.0.1" not in bird.running_config
    assert FIRST not in bird.running_config
    assert "Secret calico-system/bgp-secrets has no key 'tor'" in caplog.text

    # and the Secret is deleted
    reconciler.on_updates([upd(secret(FIRST))])
    assert reconciler.reconcile() is Outcome.RELOADED
    reconciler.on_updates([delete(secret(FIRST))])
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "neighbor 198.19.0.1" not in bird.running_config
    _no_secret_outside_config(caplog, reconciler)


def test_invalid_secret_is_reported_without_its_value(
        setup: tuple[ConfdReconciler, FakeBird, Path],
        caplog: pytest.LogCaptureFixture) -> None:
    reconciler, bird, _config_path = setup
    bad = secret(FIRST)
    bad["data"]["tor"] = FIRST + "!"  # not base64; the text is the would-be secret
    reconciler.on_updates([upd(d) for d in BASE] + [upd(bad)])
    reconciler.on_status(SyncStatus.IN_SYNC)
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "Secret(calico-system/bgp-secrets): data.tor: not valid base64" in caplog.text
    assert "neighbor 198.19.0.1" not in bird.running_config
    assert FIRST not in bird.running_config
    _no_secret_outside_config(caplog, reconciler)


def test_password_bird_cannot_hold_or_too_long_is_refused_without_echo(
        setup: tuple[ConfdReconciler, FakeBird, Path],
        caplog: pytest.LogCaptureFixture) -> None:
    reconciler, bird, _config_path = setup
    reconciler.on_updates([upd(d) for d in BASE] + [upd(secret(FIRST + '"x'))])
    reconciler.on_status(SyncStatus.IN_SYNC)
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "neighbor 198.19.0.1" not in bird.running_config
    assert "contains a quote" in caplog.text
    reconciler.on_updates([upd(secret(FIRST * 6))])  # 78 characters: fine
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "neighbor 198.19.0.1 as 65001;" in bird.running_config
    reconciler.on_updates([upd(secret(FIRST * 7))])  # 91: over the kernel's 80-byte limit
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "neighbor 198.19.0.1" not in bird.running_config
    assert "longer than 80 bytes" in caplog.text
    _no_secret_outside_config(caplog, reconciler)


def test_mesh_password_from_secret_and_empty_value(
        setup: tuple[ConfdReconciler, FakeBird, Path],
        caplog: pytest.LogCaptureFixture) -> None:
    """nodeMeshPassword.secretKeyRef: resolved like a peer's; missing or empty, the whole
    mesh is left out (no unauthenticated mesh session)."""
    reconciler, bird, _config_path = setup
    mesh = {"apiVersion": "projectcalico.org/v3", "kind": "BGPConfiguration",
            "metadata": {"name": "default"},
            "spec": {"nodeMeshPassword": {"secretKeyRef": {"name": "bgp-secrets",
                                                           "key": "tor"}}}}
    reconciler.on_updates([upd(d) for d in BASE[:3]] + [upd(mesh), upd(secret(FIRST))])
    reconciler.on_status(SyncStatus.IN_SYNC)
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "neighbor 198.18.0.2 as 64512;" in bird.running_config
    assert f'password "{FIRST}";' in bird.running_config
    reconciler.on_updates([upd(secret(""))])
    assert reconciler.reconcile() is Outcome.RELOADED
    assert "neighbor 198.18.0.2" not in bird.running_config
    assert ("BGPConfiguration(default): spec.nodeMeshPassword.secretKeyRef: Secret "
            "calico-system/bgp-secrets key tor: the value is empty; node-to-node mesh not "
            "rendered (no session without its password)") in caplog.text
    _no_secret_outside_config(caplog, reconciler)
