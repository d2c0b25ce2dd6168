"""Fixtures for the Typha privileged tests: the lab tests' root-namespace guard."""

from tests.privileged.lab.conftest import root_guard

__all__ = ["root_guard"]
