"""Probes: TCP connects and UDP echoes from inside a source pod's namespace, concurrently.

Role: decide `allow` or `deny` for each `ProbeSpec`. A probe's socket is created inside the
source pod's namespace (`in_netns`), so its packets leave through the pod's eth0 and cross
the node exactly as the pod's own traffic would.

Inputs: probes, a map from pod key to namespace name, a timeout per probe.
Outputs: `ProbeResult`s in the order of the probes given; a probe runs over its target
address's IP version (`ProbeSpec.family`, which `to_json` reports as `family`: 4 or 6).

Verdicts:
- TCP: `allow` when the connection is made AND a random token sent on it comes back from the
  echo server before the deadline; `deny` on refusal (RST), unreachable, or timeout.
- UDP: the token is sent up to `UDP_ATTEMPTS` times, spread over the timeout (a datagram or
  ARP resolution may drop one); `allow` when the token echoes back; `deny` on an ICMP
  port-unreachable (seen as ECONNREFUSED) or when the deadline passes.

The verdicts on a bound socket (`tcp_echo_verdict`, `udp_echo_verdict`, `deny_for`) are
shared with the conformance suite's probes (`lab.conformance.probes`), and the bounded
pool (`check_sources`, `run_bounded`) with its `MatrixProber`.

Invariants: every probe ends within its timeout (plus scheduling slack); at most
`max_workers` probes run at once; a batch is therefore bounded by
ceil(len(probes) / max_workers) * timeout.
"""

from __future__ import annotations

import errno
import random
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from pyfelix.lab.netns import in_netns
from pyfelix.lab.scenario import ProbeSpec

DEFAULT_TIMEOUT_SECONDS = 1.0
DEFAULT_MAX_WORKERS = 32
UDP_ATTEMPTS = 3
ALLOW = "allow"
DENY = "deny"
ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


@dataclass(frozen=True)
class ProbeResult:
    probe: ProbeSpec
    step: int
    result: str  # "allow" | "deny"
    detail: str  # "echoed", "refused", "timeout", "unreachable", ...
    seconds: float
    # what the nodes' flow logs recorded (lab.flows): {"action", "policy", "reporter"}; None
    # when nothing was found or flow logs were not collected (then absent from to_json)
    flow: dict[str, object] | None = None
    flows_collected: bool = False
    sport: int = 0  # the source port the probe bound (flow logs list them per record)

    @property
    def mismatch(self) -> bool:
        return self.probe.expect is not None and self.probe.expect != self.result

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step,
            "from": self.probe.source,
            "to": self.probe.target,
            "port": self.probe.port,
            "protocol": self.probe.protocol,
            "family": self.probe.family,
            "result": self.result,
            "expect": self.probe.expect,
            "detail": self.detail,
            "ms": round(self.seconds * 1000, 1),
            **({"flow": self.flow} if self.flows_collected else {}),
        }


# Every probe binds its own source port, taken in turn from a range below the kernel's
# ephemeral ports: a probe never shares a 5-tuple with an earlier one, so it cannot ride a
# flow conntrack still remembers from a previous step (a UDP "reply" to an old allowed flow
# would otherwise read as allow under a new deny policy).
SOURCE_PORT_FIRST = 10000
SOURCE_PORT_COUNT = 20000
_BIND_ATTEMPTS = 20


class _SourcePorts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = random.randrange(SOURCE_PORT_COUNT)

    def take(self) -> int:
        with self._lock:
            port = SOURCE_PORT_FIRST + self._next
            self._next = (self._next + 1) % SOURCE_PORT_COUNT
            return port


_SOURCE_PORTS = _SourcePorts()


def _bind_fresh_port(sock: socket.socket) -> None:
    wildcard = "::" if sock.family == socket.AF_INET6 else "0.0.0.0"
    for _ in range(_BIND_ATTEMPTS):
        try:
            sock.bind((wildcard, _SOURCE_PORTS.take()))
            return
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no free probe source port in {_BIND_ATTEMPTS} tries")


class Prober:
    """Runs probe batches from pod namespaces with a bounded thread pool."""

    def __init__(
        self,
        pod_netns: Mapping[str, str],
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        max_workers: int = DEFAULT_MAX_WORKERS,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"probe timeout must be positive, got {timeout}")
        self.pod_netns = dict(pod_netns)
        self.timeout = timeout
        self.max_workers = max(1, max_workers)

    def run(self, probes: Sequence[ProbeSpec], step: int = 0) -> list[ProbeResult]:
        check_sources((p.source for p in probes), self.pod_netns)
        return run_bounded(probes, lambda probe: self.probe_once(probe, step),
                           max_workers=self.max_workers, thread_name_prefix="lab-probe")

    def probe_once(self, probe: ProbeSpec, step: int = 0) -> ProbeResult:
        started = time.monotonic()
        deadline = started + self.timeout
        kind = socket.SOCK_STREAM if probe.protocol == "TCP" else socket.SOCK_DGRAM
        with in_netns(self.pod_netns[probe.source]):
            sock = socket.socket(address_family(probe.family), kind | socket.SOCK_CLOEXEC)
        try:
            _bind_fresh_port(sock)
            sport = sock.getsockname()[1]
            address = (str(probe.target_ip), probe.port)
            if probe.protocol == "TCP":
                verdict, detail = tcp_echo_verdict(sock, address, deadline)
            else:
                verdict, detail = udp_echo_verdict(sock, address, deadline)
        finally:
            sock.close()
        return ProbeResult(probe, step, verdict, detail, time.monotonic() - started,
                           sport=sport)


def address_family(version: int) -> socket.AddressFamily:
    """The socket family of IP version 4 or 6."""
    return socket.AF_INET6 if version == 6 else socket.AF_INET


def check_sources(sources: Iterable[str], pod_netns: Mapping[str, str]) -> None:
    """ValueError naming every source that is not a pod of the lab."""
    unknown = sorted(set(sources) - set(pod_netns))
    if unknown:
        raise ValueError(f"probe sources are not pods of this lab: {unknown}")


def run_bounded(items: Sequence[ItemT], work: Callable[[ItemT], ResultT], *, max_workers: int,
                thread_name_prefix: str) -> list[ResultT]:
    """`work(item)` for every item, at most `max_workers` at once, results in item order.
    The first exception raised cancels the items not started yet and is raised."""
    if not items:
        return []
    workers = min(max_workers, len(items))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix) as pool:
        futures = [pool.submit(work, item) for item in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def remaining(deadline: float) -> float:
    """Seconds left until the monotonic `deadline`, never negative."""
    return max(0.0, deadline - time.monotonic())


def deny_for(exc: OSError) -> tuple[str, str]:
    """The deny verdict and detail word for a socket error."""
    if isinstance(exc, ConnectionRefusedError):
        return DENY, "refused"
    if isinstance(exc, TimeoutError):
        return DENY, "timeout"
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return DENY, "unreachable"
    return DENY, errno.errorcode.get(exc.errno or 0, str(exc)).lower()


def _token(prefix: bytes) -> bytes:
    return prefix + secrets.token_hex(8).encode()


def tcp_echo_verdict(sock: socket.socket, address: tuple[str, int], deadline: float, *,
                     token_prefix: bytes = b"pyfelix-probe-") -> tuple[str, str]:
    """Connect the (bound) stream socket `sock` to `address`, send a random token and
    allow when it comes back before `deadline`. The caller closes the socket."""
    token = _token(token_prefix)
    try:
        sock.settimeout(remaining(deadline) or 0.001)
        sock.connect(address)
        sock.sendall(token)
        received = b""
        while len(received) < len(token):
            left = remaining(deadline)
            if left == 0:
                return DENY, "connected, no echo"
            sock.settimeout(left)
            chunk = sock.recv(len(token) - len(received))
            if not chunk:
                return DENY, "connected, closed"
            received += chunk
    except OSError as exc:
        return deny_for(exc)
    return (ALLOW, "echoed") if received == token else (DENY, "connected, wrong echo")


def udp_echo_verdict(sock: socket.socket, address: tuple[str, int], deadline: float, *,
                     token_prefix: bytes = b"pyfelix-probe-") -> tuple[str, str]:
    """Send a random token from the (bound) datagram socket `sock` to `address` up to
    `UDP_ATTEMPTS` times, spread over the time left; allow when it echoes back before
    `deadline`. The caller closes the socket."""
    token = _token(token_prefix)
    sock.setblocking(False)
    try:
        sock.connect(address)
        attempts_left = UDP_ATTEMPTS
        while attempts_left > 0 and remaining(deadline) > 0:
            sock.send(token)
            attempts_left -= 1
            wait_until = time.monotonic() + remaining(deadline) / (attempts_left + 1)
            while (left := wait_until - time.monotonic()) > 0:
                readable, _, _ = select.select([sock], [], [], left)
                if not readable:
                    break
                if sock.recv(len(token) + 64) == token:
                    return ALLOW, "echoed"
    except OSError as exc:
        return deny_for(exc)
    return DENY, "timeout"
