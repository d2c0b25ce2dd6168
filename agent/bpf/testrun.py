"""Run loaded tc/XDP programs on crafted packets with BPF_PROG_TEST_RUN (raw bpf() syscall).

Role: the test and micro-benchmark harness of the BPF programs: real verdicts from the real
verifier-approved code, plus the kernel's ns-per-run over `repeat` runs.

Inputs: a program fd (LoadedDataplane.prog_fd(name)), a packet (agent.bpf.packets), and for
tc the ifindex the program sees as skb->ifindex (our programs key endpoints and conntrack by
it). The kernel resolves that ifindex in the CALLING THREAD's network namespace (ENODEV if
absent): loopback (1) exists everywhere; other ifindexes need a namespace of our own, entered
with `NetnsThread`. Outputs: `TestRunOutput(retval, duration_ns, data_out)`.
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pyfelix.agent.bpf.syscall import TestRunOutput, prog_test_run

TC_ACT_OK = 0
TC_ACT_SHOT = 2
TC_ACT_REDIRECT = 7
XDP_DROP = 1
XDP_PASS = 2

T = TypeVar("T")


class SkBuff(ctypes.Structure):
    """struct __sk_buff (include/uapi/linux/bpf.h) as BPF_PROG_TEST_RUN takes it as ctx.
    Only mark, priority, ifindex, ingress_ifindex, cb, tstamp, wire_len and gso_* may be
    non-zero; the kernel rejects anything else."""

    _fields_ = [
        ("len", ctypes.c_uint32),
        ("pkt_type", ctypes.c_uint32),
        ("mark", ctypes.c_uint32),
        ("queue_mapping", ctypes.c_uint32),
        ("protocol", ctypes.c_uint32),
        ("vlan_present", ctypes.c_uint32),
        ("vlan_tci", ctypes.c_uint32),
        ("vlan_proto", ctypes.c_uint32),
        ("priority", ctypes.c_uint32),
        ("ingress_ifindex", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("tc_index", ctypes.c_uint32),
        ("cb", ctypes.c_uint32 * 5),
        ("hash", ctypes.c_uint32),
        ("tc_classid", ctypes.c_uint32),
        ("data", ctypes.c_uint32),
        ("data_end", ctypes.c_uint32),
        ("napi_id", ctypes.c_uint32),
        ("family", ctypes.c_uint32),
        ("remote_ip4", ctypes.c_uint32),
        ("local_ip4", ctypes.c_uint32),
        ("remote_ip6", ctypes.c_uint32 * 4),
        ("local_ip6", ctypes.c_uint32 * 4),
        ("remote_port", ctypes.c_uint32),
        ("local_port", ctypes.c_uint32),
        ("data_meta", ctypes.c_uint32),
        ("flow_keys", ctypes.c_uint64),
        ("tstamp", ctypes.c_uint64),
        ("wire_len", ctypes.c_uint32),
        ("gso_segs", ctypes.c_uint32),
        ("sk", ctypes.c_uint64),
        ("gso_size", ctypes.c_uint32),
        ("tstamp_type", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 3),
        ("hwtstamp", ctypes.c_uint64),
    ]


class XdpMd(ctypes.Structure):
    """struct xdp_md as BPF_PROG_TEST_RUN takes it (data/data_end/data_meta set by the
    kernel from the packet; egress_ifindex must be 0)."""

    _fields_ = [
        ("data", ctypes.c_uint32),
        ("data_end", ctypes.c_uint32),
        ("data_meta", ctypes.c_uint32),
        ("ingress_ifindex", ctypes.c_uint32),
        ("rx_queue_index", ctypes.c_uint32),
        ("egress_ifindex", ctypes.c_uint32),
    ]


def run_tc(prog_fd: int, packet: bytes, *, ifindex: int = 1, repeat: int = 1,
           mark: int = 0) -> TestRunOutput:
    """Run a tc (sched_cls) program as if the packet were on interface `ifindex`."""
    ctx = SkBuff(ifindex=ifindex, mark=mark)
    return prog_test_run(prog_fd, packet, ctx=bytes(ctx), repeat=repeat)


def run_xdp(prog_fd: int, packet: bytes, *, ingress_ifindex: int = 1,
            repeat: int = 1) -> TestRunOutput:
    """Run an XDP program as if the packet arrived on `ingress_ifindex` (rx queue 0)."""
    ctx = XdpMd(data=0, data_end=len(packet), ingress_ifindex=ingress_ifindex)
    return prog_test_run(prog_fd, packet, ctx=bytes(ctx), repeat=repeat)


_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsThread:
    """A worker thread living in another network namespace (setns affects only the calling
    thread), running submitted callables there: `with NetnsThread(path) as ns:
    ns.call(run_tc, fd, pkt, ifindex=2)`. `path` is e.g. /run/netns/<name>."""

    def __init__(self, netns_path: str) -> None:
        self._path = netns_path
        self._jobs: queue.Queue[tuple[Callable[[], Any], queue.Queue] | None] = queue.Queue()
        self._ready: queue.Queue[BaseException | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="netns-worker", daemon=True)

    def __enter__(self) -> NetnsThread:
        self._thread.start()
        err = self._ready.get()
        if err is not None:
            self._thread.join()
            raise err
        return self

    def __exit__(self, *exc: object) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)

    def _serve(self) -> None:
        try:
            fd = os.open(self._path, os.O_RDONLY)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({self._path}): {os.strerror(err)}")
            finally:
                os.close(fd)
        except BaseException as e:  # report to the caller of __enter__
            self._ready.put(e)
            return
        self._ready.put(None)
        while (job := self._jobs.get()) is not None:
            fn, reply = job
            try:
                reply.put((True, fn()))
            except BaseException as e:
                reply.put((False, e))

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        reply: queue.Queue = queue.Queue()
        self._jobs.put((lambda: fn(*args, **kwargs), reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value
