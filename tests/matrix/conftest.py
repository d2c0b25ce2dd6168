"""Fixtures for the matrix tests (`make test-matrix`): the lab tests' root-namespace guard."""

from tests.privileged.lab.conftest import root_guard

__all__ = ["root_guard"]
