"""Fixtures for the reliability tests: the lab tests' root-namespace guard."""

from __future__ import annotations

import os

import pytest

from tests.privileged.lab.conftest import RootGuard


@pytest.fixture
def root_guard() -> RootGuard:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    return RootGuard()
