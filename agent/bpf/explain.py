"""The BPF half of `pyfelix explain`: run the program attached to a workload interface on a
crafted packet (BPF_PROG_TEST_RUN) and read back which record of the chain decided.

Role: no traffic is sent. The program is the one the kernel runs for the interface (the
prog id in our tc filter's name, `agent.bpf.attach`), so its maps are the node's pinned maps:
the verdict is the dataplane's own. The packet carries skb->mark `MARK_TRACE`: the programs
then record the decision in `verdict_trace` (bpf/include/verdict_trace.h) and count nothing,
create no conntrack entry.

Inputs: the pin directory, the interface name, the hook ("to_wep": the pod's ingress policy,
"from_wep": its egress policy), the packet bytes. Runs in the CALLING THREAD's network
namespace (the node's: the interface and its ifindex live there; `testrun.NetnsThread`
enters one for in-process callers). Outputs: `KernelVerdict`.

Invariants: one traced run at a time per pin directory (a lock file under /run/lock), the
trace slot zeroed before the run; a slot still zero after it means the program decided
before policy (conntrack, no endpoint, source check, NAT): `decided_before_policy`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pyfelix.agent.bpf import syscall
from pyfelix.agent.bpf.attach import FILTER_NAME_PREFIX
from pyfelix.agent.bpf.maps import ids as ids_map
from pyfelix.agent.bpf.maps import verdict_trace as trace_map
from pyfelix.agent.bpf.maps.base import BpfMap
from pyfelix.agent.bpf.testrun import TC_ACT_OK, run_tc

if TYPE_CHECKING:
    from pyfelix.agent.bpf.attach import PyRoute2Attacher

HOOKS = {"to_wep": ("egress", "calico_to_wep"), "from_wep": ("ingress", "calico_from_wep")}
LOCK_DIR = Path("/run/lock")


class ExplainError(RuntimeError):
    """The program cannot be run (interface, filter or pins missing); the message says which."""


@dataclass(frozen=True)
class KernelVerdict:
    hook: str
    interface: str
    ifindex: int
    prog_id: int
    retval: int
    trace: dict | None  # verdict_trace.decode_value(), None: decided before policy
    counter_name: str | None  # the deciding record's counter (a rule id, tier-end:, ...)

    @property
    def allowed(self) -> bool:
        return self.retval == TC_ACT_OK

    @property
    def decided_before_policy(self) -> bool:
        return self.trace is None


def attached_prog_id(ifindex: int, hook: str, attacher: PyRoute2Attacher | None = None) -> int:
    """The id of our program attached at `hook` of the interface (ExplainError if none).
    `attacher`: a netlink handle of this namespace to reuse (opening one costs ~6 ms, listing
    the filters 0.3 ms); None: one of its own, closed after."""
    from pyfelix.agent.bpf.attach import PyRoute2Attacher

    tc_hook, prog_name = HOOKS[hook]
    own = attacher is None
    handle = PyRoute2Attacher() if attacher is None else attacher
    try:
        filters = handle.list_filters(ifindex, tc_hook)
    finally:
        if own:
            handle.close()
    prefix = f"{FILTER_NAME_PREFIX}{prog_name}:"
    for f in filters:
        if f.ours and f.name.startswith(prefix):
            return int(f.name[len(prefix):])
    raise ExplainError(f"no {prog_name} program attached at tc {tc_hook} of ifindex {ifindex}")


def _lock_path(pin_dir: str) -> Path:
    digest = hashlib.sha256(os.path.realpath(pin_dir).encode()).hexdigest()[:16]
    return LOCK_DIR / f"pyfelix-explain-{digest}.lock"


def run_policy_program(pin_dir: str, interface: str, hook: str, packet: bytes, *,
                       attacher: PyRoute2Attacher | None = None) -> KernelVerdict:
    """Run the attached program of `interface` at `hook` on `packet`, traced. `attacher`:
    see attached_prog_id (a caller explaining many packets keeps one per namespace)."""
    if hook not in HOOKS:
        raise ValueError(f"hook must be one of {sorted(HOOKS)}, not {hook!r}")
    try:
        ifindex = socket.if_nametoindex(interface)
    except OSError as exc:
        raise ExplainError(f"interface {interface!r} not found in this network namespace"
                           ) from exc
    prog_id = attached_prog_id(ifindex, hook, attacher)
    try:
        fd = syscall.prog_fd_by_id(prog_id)
    except OSError as exc:
        raise ExplainError(f"program {prog_id} on {interface}: {exc}") from exc
    if fd is None:
        raise ExplainError(f"program {prog_id} on {interface} is no longer loaded")
    try:
        trace_pin = Path(pin_dir) / trace_map.PARAMS.pin_name
        if not trace_pin.exists():
            raise ExplainError(f"{trace_pin} is not pinned (an agent of this version runs "
                               f"with BPFPinDir={pin_dir}?)")
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        with (open(_lock_path(pin_dir), "a") as lock,
              BpfMap.open_pinned(trace_map.PARAMS, pin_dir) as trace):
            fcntl.flock(lock, fcntl.LOCK_EX)
            trace.update(trace_map.KEY, trace_map.EMPTY)
            out = run_tc(fd, packet, ifindex=ifindex, mark=trace_map.MARK_TRACE)
            raw = trace.lookup(trace_map.KEY)
    finally:
        os.close(fd)
    decoded = None if raw is None or raw == trace_map.EMPTY else trace_map.decode_value(raw)
    counter_name = None
    if decoded is not None and decoded["counter_id"]:
        with BpfMap.open_pinned(ids_map.PARAMS, pin_dir) as ids:
            name = ids.lookup(ids_map.encode_key(ids_map.IdKind.RULE, decoded["counter_id"]))
        counter_name = ids_map.decode_value(name) if name is not None else None
    return KernelVerdict(hook, interface, ifindex, prog_id, out.retval, decoded, counter_name)
