"""Fixtures for the Felix-extras privileged tests (NAT outgoing, host endpoints and failsafes,
VXLAN, static ARP, IPVS awareness, status reporting): root is required, and `root_unchanged`
proves afterwards that the root namespace's links and routes are as before and that no lab
namespace of a finished run was left behind."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from pyfelix.lab import naming
from pyfelix.lab.runstate import run_is_alive
from tests.privileged.felix_extras.extras_lab import RootSnapshot

# The dataplanes every lab test here runs on (in BPF mode host endpoints and failsafes are
# iptables rules beside the tc programs: see agent/dataplane/linux.py).
DATAPLANES = ["iptables", "bpf"]


@pytest.fixture
def root_unchanged() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    before = RootSnapshot.take()
    yield
    after = RootSnapshot.take()
    assert after.links == before.links, f"root links changed: {after.links ^ before.links}"
    assert after.routes == before.routes, f"root routes changed: {after.routes ^ before.routes}"
    leaked = [n for n in after.lab_netns - before.lab_netns
              if not run_is_alive(naming.run_state_dir(naming.parse_run_id(n) or ""))]
    assert not leaked, f"lab namespaces left behind: {leaked}"
