"""Fixtures for the Kubernetes datastore tests: a fake API server (tests/fakes_kube), a
KubeAPI reaching it through a kubeconfig file, and started KubeSyncers (all torn down)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyfelix.agent.syncer.backoff import Backoff
from pyfelix.agent.syncer.kube import KubeSyncer, WatchOptions
from pyfelix.agent.syncer.kube_api import KubeAPI
from tests.fakes_kube.server import FakeKubeAPIServer
from tests.privileged.etcd.etcd_testlib import TimedRecorder

SyncerFactory = Callable[..., tuple[KubeSyncer, TimedRecorder]]


@pytest.fixture
def fake_kube() -> Iterator[FakeKubeAPIServer]:
    server = FakeKubeAPIServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube_api(fake_kube: FakeKubeAPIServer, tmp_path: Path) -> Iterator[KubeAPI]:
    kubeconfig = fake_kube.write_kubeconfig(str(tmp_path / "kubeconfig"))
    api = KubeAPI.from_environment(kubeconfig=kubeconfig, request_timeout=5.0)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def start_kube_syncer(kube_api: KubeAPI) -> Iterator[SyncerFactory]:
    started: list[KubeSyncer] = []

    def start(api: KubeAPI | None = None, **options: Any) -> tuple[KubeSyncer, TimedRecorder]:
        options.setdefault("page_size", 500)
        options.setdefault("watch_timeout", 30)
        options.setdefault("backoff", lambda: Backoff(initial=0.02, maximum=0.2))
        resource_types = options.pop("resource_types", None)
        kwargs: dict[str, Any] = {"options": WatchOptions(**options)}
        if resource_types is not None:
            kwargs["resource_types"] = resource_types
        syncer = KubeSyncer(api or kube_api, **kwargs)
        recorder = TimedRecorder()
        syncer.start(recorder)
        started.append(syncer)
        return syncer, recorder

    yield start
    for syncer in started:
        syncer.stop()
