"""The two-namespace BIRD lab fixture (`lab`, defined in test_priv_confd_bgp) for every test
module of this directory."""

from tests.privileged.confd.test_priv_confd_bgp import lab  # noqa: F401
