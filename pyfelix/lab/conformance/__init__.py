"""Network-policy conformance suite for the lab (after upstream Kubernetes' netpol e2e tests).

Namespaces x, y, z with pods a, b, c (labels `ns: <ns>`, `pod: <pod>`), each serving TCP 80,
TCP 81 and UDP 80 (named serve-80-tcp, serve-81-tcp, serve-80-udp). Every case applies its
resources, then the whole 9x8 reachability matrix is probed on its columns (TCP/80, TCP/81,
UDP/80, and ICMP echo where the case says) and compared with the case's EXPECTED matrix,
which comes from a hand-written truth model per case, never from the agent.

Modules:
- `world`        the pods, IPs, ports, and per-case world changes (relabels, absent pods).
- `resources`    builders for Kubernetes / Calico documents.
- `case`         `Case` (resources + expected verdict predicates), checks and selection.
- `k8s_cases`    Kubernetes NetworkPolicy cases; `calico_cases` Calico-specific cases.
- `matrix`       expected cells, concurrent probing (TCP/UDP via the lab, ICMP via `icmp`),
                 truth tables.
- `plan`         the suite as one lab scenario in the `steps` form (one step per case).
- `suite`        run the plan on one dataplane with real agents; `report` the figures.
- `__main__`     `python -m pyfelix.lab.conformance [--dataplane X] [-o json]`.

`CONFORMANT_DATAPLANES` lists the dataplanes the privileged test and the default command run.
A dataplane is listed only once it passes; when listed, it really runs (no skip).
"""

from __future__ import annotations

from pyfelix.lab.conformance.calico_cases import CASES as CALICO_CASES
from pyfelix.lab.conformance.case import Case
from pyfelix.lab.conformance.k8s_cases import CASES as K8S_CASES

ALL_CASES: tuple[Case, ...] = (*K8S_CASES, *CALICO_CASES)
CASES_BY_NAME: dict[str, Case] = {c.name: c for c in ALL_CASES}

# Cases the privileged test also runs with the pods spread over two nodes (BGP-routed): the
# cases they follow come along (see `case.select_cases`). Not the cases with a pod removed
# (k8s-pod-absent, k8s-pod-added-*): the lab's multi-node in-sync waits for a BGP route to
# EVERY pod of the topology, and a pod without a Pod document rightly has none, so the lab
# times out there (lab.agents._cross_node_routes_ready; reported to the lead).
CROSS_NODE_SAMPLE: tuple[str, ...] = (
    "k8s-default-deny-all", "k8s-policy-update", "k8s-pod-relabel-target", "k8s-and-peer",
    "k8s-or-peers", "k8s-ipblock-except", "k8s-egress-to-pods", "k8s-egress-named-port",
    "k8s-named-port-tcp", "k8s-namespace-relabel",
    "calico-pass-to-k8s-policy", "calico-tier-policy-deleted", "calico-global-network-set-relabel",
    "calico-service-account-selector", "calico-icmp-deny", "calico-egress-selector",
    "calico-not-selector",
)

# Add "bpf" here once `python -m pyfelix.lab.conformance --dataplane bpf` reports no mismatch.
CONFORMANT_DATAPLANES: tuple[str, ...] = ("iptables", "bpf")

__all__ = ["ALL_CASES", "CALICO_CASES", "CONFORMANT_DATAPLANES", "CROSS_NODE_SAMPLE",
           "K8S_CASES", "Case"]
