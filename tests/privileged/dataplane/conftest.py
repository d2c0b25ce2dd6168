"""Fixtures for privileged dataplane tests: network namespaces THIS test run creates.

Every namespace is named `pyf5-<pid>-<n>` (unique per run), created with `ip netns add` and
deleted in a `finally` (also on failure and Ctrl-C). A session fixture snapshots the root
namespace (links, routes, iptables and ip6tables in both backends, ipsets) before the tests
and checks it is unchanged after them: these tests must never write outside their own
namespaces.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.privileged.dataplane.dp_netns import PREFIX, NetnsFactory, root_snapshot, sh


@pytest.fixture(scope="session", autouse=True)
def root_namespace_untouched() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("privileged dataplane tests need root")
    before = root_snapshot()
    yield
    leftovers = [n for n in sh("ip", "netns", "list").split() if n.startswith(PREFIX)]
    assert leftovers == [], f"namespaces left behind: {leftovers}"
    after = root_snapshot()
    for key in before:
        assert after[key] == before[key], f"root namespace {key} changed during the tests"


@pytest.fixture
def make_netns() -> Iterator[NetnsFactory]:
    factory = NetnsFactory()
    try:
        yield factory
    finally:
        factory.cleanup()
