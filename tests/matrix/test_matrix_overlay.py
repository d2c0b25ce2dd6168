"""`make test-matrix`: the two overlay scenarios under ipv6 and dual on both dataplanes, with
tests/privileged/lab/test_lab_overlay.py's checks (issue 18, overlays).

Beyond the verdicts (tests/matrix/test_matrix_ip_family.py checks those through the CLI),
each case checks where the packets went: IPv4 routes to remote pods through vxlan.calico /
tunl0, IPv6 ones through vxlan-v6.calico (proto 81, onlink, no BIRD route) for VXLAN and
over BIRD's routes for IPIP's unencapsulated IPv6 twin pool; the tunnel devices carried
packets both ways; in BPF mode the denials were made by the destination node. IPIP under
dual needs CONFIG_NET_IPIP: without it the lab's at-once refusal is checked, then skipped.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.privileged.lab.test_lab_overlay import OVERLAYS, ipip_kernel, run_overlay_case

pytestmark = pytest.mark.privileged

__all__ = ["ipip_kernel"]  # the module-scoped fixture, probed before root_guard's snapshot

CASES = list(itertools.product(sorted(OVERLAYS), ["bpf", "iptables"], ["ipv6", "dual"]))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("overlay", "dataplane", "family"), CASES,
                         ids=["-".join(c) for c in CASES])
def test_overlay_per_family(overlay: str, dataplane: str, family: str, ipip_kernel: bool,
                            root_guard: Any) -> None:
    run_overlay_case(overlay, dataplane, family, ipip_kernel, root_guard)
