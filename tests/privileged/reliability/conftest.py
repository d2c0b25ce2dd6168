"""Fixtures for the reliability tests: the lab tests' root-namespace guard (`root_guard`)."""

from tests.privileged.lab.conftest import root_guard

__all__ = ["root_guard"]
