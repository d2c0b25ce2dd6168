"""Names of every kernel object and file the lab creates: the one place ownership is decided.

Role: turn a run id and scenario names into network-namespace names, interface names and
per-run paths, and recognise those names again (the sweep relies on it).

Inputs: a run id (`new_run_id()`), node names, pod namespace/name pairs.
Outputs: strings and paths; nothing here touches the kernel.

Invariants:
- Every lab namespace is named `pf<6 hex>-<role>` (`LAB_PREFIX` + run id + `-`), so
  `ip netns list` shows which run owns it, and `parse_run_id()` recovers the run id.
- A run's state lives under `RUN_STATE_ROOT/<run id>/`; its pinned BPF objects, when agents
  pin any, under `BPFFS_ROOT/<run id>/`. Both are removed on teardown or by the sweep.
- Workload interface names follow Calico's rule so the agent computes the same name from the
  pod: `<prefix>` + the first 11 hex digits of sha1("<namespace>.<pod>"), at most 15 chars.

Easy to get wrong: Linux interface names are at most 15 bytes (IFNAMSIZ - 1); a longer
`FELIX_INTERFACEPREFIX` would silently truncate, so `workload_interface_name` refuses it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

LAB_PREFIX = "pf"
RUN_ID_HEX_DIGITS = 6
# Whole names only: use fullmatch (with match, `$` accepts a trailing newline).
RUN_ID_PATTERN = re.compile(rf"^{LAB_PREFIX}[0-9a-f]{{{RUN_ID_HEX_DIGITS}}}$")
LAB_NETNS_PATTERN = re.compile(rf"^({LAB_PREFIX}[0-9a-f]{{{RUN_ID_HEX_DIGITS}}})-[a-z0-9.-]+$")

RUN_STATE_ROOT = Path("/run/pyfelix-lab")
BPFFS_ROOT = Path("/sys/fs/bpf")
DEFAULT_INTERFACE_PREFIX = "cali"
IFNAME_MAX_LEN = 15
WORKLOAD_HASH_DIGITS = 11
# netns names are file names under /run/netns; keep them readable but bounded.
NETNS_NAME_MAX_LEN = 48

UNDERLAY_ROLE = "ul"


def new_run_id() -> str:
    """A fresh run id such as `pf3a9c0e`."""
    return LAB_PREFIX + secrets.token_hex(RUN_ID_HEX_DIGITS // 2)


def parse_run_id(netns_name: str) -> str | None:
    """The run id owning a lab namespace name, or None when the name is not one of ours."""
    match = LAB_NETNS_PATTERN.fullmatch(netns_name)
    return match.group(1) if match else None


def underlay_netns(run_id: str) -> str:
    return f"{run_id}-{UNDERLAY_ROLE}"


def node_netns(run_id: str, node_index: int, node_name: str) -> str:
    name = f"{run_id}-n-{node_name}"
    return name if len(name) <= NETNS_NAME_MAX_LEN else f"{run_id}-n{node_index}"


def pod_netns(run_id: str, pod_index: int, namespace: str, pod_name: str) -> str:
    name = f"{run_id}-p-{namespace}.{pod_name}"
    return name if len(name) <= NETNS_NAME_MAX_LEN else f"{run_id}-p{pod_index}"


def workload_interface_name(
    namespace: str, pod_name: str, prefix: str = DEFAULT_INTERFACE_PREFIX
) -> str:
    """Host-side veth name of a pod, as Calico's CNI plugin and Felix compute it."""
    if len(prefix) + WORKLOAD_HASH_DIGITS > IFNAME_MAX_LEN:
        raise ValueError(
            f"interface prefix {prefix!r} too long: prefix + {WORKLOAD_HASH_DIGITS} hex digits "
            f"must fit in {IFNAME_MAX_LEN} characters"
        )
    digest = hashlib.sha1(f"{namespace}.{pod_name}".encode()).hexdigest()
    return prefix + digest[:WORKLOAD_HASH_DIGITS]


def underlay_port_name(node_index: int) -> str:
    """Name of a node's veth end inside the underlay namespace (attached to the bridge)."""
    return f"n{node_index}"


def run_state_dir(run_id: str, root: Path = RUN_STATE_ROOT) -> Path:
    return root / run_id


def run_bpffs_dir(run_id: str, root: Path = BPFFS_ROOT) -> Path:
    return root / run_id
