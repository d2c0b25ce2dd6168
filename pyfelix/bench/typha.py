"""Benchmark `typha`: fan-out latency, server memory and etcd load with many clients.

Setup (issue 11): a real etcd (Debian's /usr/bin/etcd on free loopback ports, data in a
temporary directory, killed after) holding `endpoints` WorkloadEndpoints; a REAL
`pyfelix typha` process (plain TCP on loopback, syncer type felix) watching it; `clients`
real `TyphaSyncer`s in this process (threads, connected in waves of `wave` so their
snapshots do not all land at once). Then `churn` of the endpoints are rewritten round robin
through the etcd client at `update_rate` per second for `update_seconds`, each write
stamping the wall-clock time into an annotation.

Figures (one run; the run is long, so no repeats):
- `clients`: clients in sync when the updates started (and `clients_connected_at_end`);
- `endpoints`: keys in the server's snapshot (its `typha_snapshot_size`);
- `fanout_p50_ms`, `fanout_p99_ms`, `fanout_max_ms`: per (client, update), from just before
  the etcd write to the client's `on_updates` callback: the whole path (etcd, its watch, the
  server's syncer and cache, the socket, the client's decoding). Target (issues 11, 22): p99 <=
  1,000 ms with 500 and with 1,000 clients, 10,000 endpoints, 100 updates/s;
- `missing_deliveries`: (client, update) pairs never delivered (should be 0; the latency
  figures cover the delivered ones); `update_rate_achieved`: writes per second managed;
- `server_fanout_p99_ms`: the server's own view (`typha_updates_fanout_latency`, update
  received -> written to the socket), as the upper bound of the histogram bucket holding
  the 99th percentile;
- `server_rss_mb`, `server_peak_rss_mb`: the server process's VmRSS after the updates, and
  its VmHWM (peak);
- `handshake_retries`: connections the server closed before their hello (it bounds how
  many wait for theirs), tried again by the client after a backoff;
- `connect_seconds`: from the first client's start until every client has its server
  hello (clients start in waves of `wave` at `connect_rate` per second, without waiting
  for earlier snapshots; target (issue 22): 1,000 clients within 10 s);
- `in_sync_seconds`: until every client has decoded its snapshot and is in sync (bounded
  here by the simulated clients' decoding: 1,000 x 10,000 documents in two Python
  processes on the server's 2 cores, work each agent does on its own node in a cluster);
- the etcd load, from etcd's own `etcd_debugging_mvcc_watcher_total`:
  `etcd_watches_with_typha` (measured while every client is connected through Typha);
  `etcd_watches_per_direct_client` (measured: `direct_sample` agents' syncers reading etcd
  themselves, watchers added / agents) and `etcd_watches_without_typha` (that per-agent
  figure x `clients`: what the same clients would hold reading etcd directly; running 500
  direct syncers here would measure this machine, not etcd).

The benchmark runs the plan once per client count of `CLIENT_SWEEP` (250, 500, 1,000):
the figures above are the largest run's, and `fanout_p50_ms_<C>`, `fanout_p99_ms_<C>`,
`connect_seconds_<C>`, `in_sync_seconds_<C>`, `server_rss_mb_<C>` (...) are each run's,
for the chart of latency against clients (`bench.plots`).

With `BenchSettings.quick()` (tests, `pyfelix bench --quick`) the plan shrinks to a few
clients (6 and 12) and endpoints; the figures then only show that the path works.

The simulated clients run in `client_processes` processes (2), each with an asyncio loop
(see `_SimulatedClients`), with the cyclic garbage collector off (see `_client_worker`):
`full_clients` (10) of them are full clients, driving the real client's protocol pieces and
checked to hold every endpoint at the end (`full_clients` figure); the rest are COUNTING
clients, which check frame order and sequence numbers and read the churned endpoints'
generations and write times from the update messages' text, but do not decode snapshot
chunks (an agent does that on its own node). They, the server, etcd and the writer share
the machine's 2 cores, so the figures are an upper bound of what the server alone would
show.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, TypeVar

from pyfelix.agent.syncer.api import DatastoreError, RawUpdate, SyncStatus
from pyfelix.bench.registry import BenchContext, Figures, benchmark
from pyfelix.lab.ports import free_port

ETCD_BINARY = "/usr/bin/etcd"
WRITTEN_AT = "bench.pyfelix.org/written-at"
CHURN_PREFIX = "churn-"
LOAD_CHUNK = 500
HANDSHAKE_RETRIES = 20


class _SessionEnded(Exception):
    """A bench client's connection ended. `retryable`: it ended before the server's hello (or
    with a refusal worth retrying), so it is tried again; after the hello it is an error."""

    def __init__(self, retryable: bool, reason: str) -> None:
        super().__init__(reason)
        self.retryable = retryable
        self.reason = reason
# refusals a client tries again after: the server has too many connections waiting for their
# hello ("try again later"), or did not get to this one's hello in time
RETRYABLE_REFUSALS = ("server-full", "bad-hello")
REPO_ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT_CHUNK_KVS = 1000  # agent.typha.protocol.SNAPSHOT_CHUNK (checked by a test)


@dataclass(frozen=True)
class TyphaBenchPlan:
    clients: int = 500
    endpoints: int = 10_000
    update_rate: float = 100.0  # datastore writes per second
    update_seconds: float = 10.0
    churn: int = 100  # endpoints rewritten round robin
    wave: int = 25  # clients started together (over all client processes)
    connect_rate: float = 250.0  # clients started per second (waves do not wait for sync)
    # processes the simulated clients are spread over: decoding 500 clients' updates takes
    # about one core of Python, more than one process can give with the server beside it
    client_processes: int = 2
    # clients that decode everything with the agent's own client code (`ClientState`), and
    # are checked to hold every endpoint; the others are counting clients (see
    # `_SimulatedClients`)
    full_clients: int = 10
    direct_sample: int = 10  # direct etcd syncers started to measure their watches
    sync_timeout: float = 900.0  # bound on the connect phase
    drain_timeout: float = 60.0  # bound on waiting for the last updates

    @classmethod
    def quick(cls) -> TyphaBenchPlan:
        return cls(clients=12, endpoints=300, update_rate=50.0, update_seconds=1.0, churn=20,
                   wave=12, client_processes=1, full_clients=4, direct_sample=3,
                   sync_timeout=60.0, drain_timeout=30.0)


CLIENT_SWEEP = (250, 500, 1000)  # `make bench`: one run per count, figures suffixed _<count>
QUICK_CLIENT_SWEEP = (6, 12)


def _endpoint(index: int, generation: int = 0, *, churn: bool = False) -> dict[str, Any]:
    name = f"{CHURN_PREFIX}{index}" if churn else f"ep-{index}"
    annotations = {WRITTEN_AT: repr(time.time())} if churn else {}
    return {
        "apiVersion": "projectcalico.org/v3", "kind": "WorkloadEndpoint",
        "metadata": {"name": name, "namespace": f"ns{index % 50}",
                     "labels": {"app": f"app{index % 200}", "generation": str(generation)},
                     "annotations": annotations},
        "spec": {"node": f"node{index % 500}", "orchestrator": "k8s", "workload": name,
                 "endpoint": "eth0", "interfaceName": f"cali{index:011d}",
                 "ipNetworks": [f"10.{64 + index // 65536}.{index // 256 % 256}."
                                f"{index % 256}/32"],
                 "profiles": [f"kns.ns{index % 50}"]},
    }


def _http_get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return str(reply.read().decode())
    except OSError:
        return ""


def _sample(text: str, name: str, labels: str = "") -> float | None:
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else "") + r" (\S+)"
    match = re.search(r"^" + pattern + r"$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def _histogram_p99(text: str, name: str) -> float:
    """Upper bound (seconds) of the bucket holding the 99th percentile, summed over labels."""
    buckets: dict[float, float] = {}
    for match in re.finditer(re.escape(name) + r'_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)', text):
        bound = math.inf if match.group(1) == "+Inf" else float(match.group(1))
        buckets[bound] = buckets.get(bound, 0.0) + float(match.group(2))
    total = buckets.get(math.inf, 0.0)
    if not total:
        return math.nan
    return min(bound for bound, count in buckets.items() if count >= 0.99 * total)


def _rss_mb(pid: int) -> tuple[float, float]:
    fields: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = float(value.split()[0]) / 1024.0
    return fields.get("VmRSS", math.nan), fields.get("VmHWM", math.nan)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def _stop_process(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


class _Etcd:
    """A throwaway etcd on free loopback ports, data under `directory`."""

    def __init__(self, directory: Path) -> None:
        if not os.path.exists(ETCD_BINARY):
            raise RuntimeError(f"{ETCD_BINARY} is missing: the typha benchmark needs Debian's "
                               "etcd-server (scripts/setup.sh installs it)")
        self.port = free_port()
        peer = f"http://127.0.0.1:{free_port()}"
        name = f"pyf-bench-{os.getpid()}"
        self.log_path = directory / "etcd.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [ETCD_BINARY, "--name", name, "--data-dir", str(directory / f"etcd-{self.port}"),
                 "--listen-client-urls", f"http://127.0.0.1:{self.port}",
                 "--advertise-client-urls", f"http://127.0.0.1:{self.port}",
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"{name}={peer}", "--initial-cluster-state", "new",
                 "--log-level", "warn", "--logger", "zap", "--quota-backend-bytes",
                 str(2 * 1024**3)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while "etcd_server_has_leader 1" not in self.metrics():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = self.log_path.read_text()
                error = _PortRace if "address already in use" in log else RuntimeError
                raise error(f"etcd did not start: {log[-2000:]}")
            time.sleep(0.1)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> str:
        return _http_get(f"http://127.0.0.1:{self.port}/metrics")

    def watchers(self) -> float:
        value = _sample(self.metrics(), "etcd_debugging_mvcc_watcher_total")
        if value is None:
            raise RuntimeError("etcd reports no etcd_debugging_mvcc_watcher_total")
        return value

    def stop(self) -> None:
        _stop_process(self.process, signal.SIGKILL)


T = TypeVar("T")


def _retry_port_race(start: Callable[[], T], attempts: int = 3) -> T:
    """Free ports are picked before the child binds them; another process may take one in
    between. Start again with new ports."""
    for attempt in range(attempts):
        try:
            return start()
        except _PortRace:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


class _PortRace(RuntimeError):
    """A child could not bind the port picked for it."""


class _Server:
    """`pyfelix typha` in a child process, started and loaded with `keys` keys; stopped with
    SIGTERM (killed if it hangs)."""

    def __init__(self, datastore: str, log_path: Path, timeout: float, keys: int) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.log_path = log_path
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pyfelix.cli.main", "typha", "--datastore", datastore,
                 "--listen", f"127.0.0.1:{self.port}", "--insecure", "--syncer-types",
                 "felix", "--metrics-port", str(self.metrics_port), "--metrics-host",
                 "127.0.0.1", "--log-severity", "Warning"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=REPO_ROOT)
        try:
            self.wait_snapshot(keys, timeout)
        except BaseException:
            self.stop()
            raise

    def metrics(self) -> str:
        return _http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def wait_snapshot(self, keys: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.log_path.read_text()
                error = _PortRace if "in use" in log else RuntimeError
                raise error(f"typha server exited with {self.process.returncode}: "
                            f"{log[-2000:]}")
            size = _sample(self.metrics(), "typha_snapshot_size", 'syncer_type="felix"')
            if size is not None and size >= keys:
                return
            time.sleep(0.1)
        raise RuntimeError(f"typha server did not load {keys} keys within {timeout} s")

    def stop(self) -> None:
        _stop_process(self.process)


class _Registry:
    """Counts clients in sync; lets the bench wait for a number of them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.in_sync = 0
        self.hellos = 0

    def hello(self) -> None:
        with self.cond:
            self.hellos += 1
            self.cond.notify_all()

    def wait_hellos(self, count: int, deadline: float) -> bool:
        with self.cond:
            while self.hellos < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 1.0))
            return True

    def synced(self) -> None:
        with self.cond:
            self.in_sync += 1
            self.cond.notify_all()

    def wait_in_sync(self, count: int, deadline: float) -> bool:
        with self.cond:
            while self.in_sync < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 1.0))
            return True


class _BenchClient:
    """Callbacks of one simulated agent: keep only latencies and the newest generation of
    each churned endpoint (not the documents: 500 clients x 10,000 documents would not
    fit)."""

    def __init__(self, registry: _Registry) -> None:
        self.registry = registry
        self.latencies: list[tuple[float, float]] = []  # (written at, seconds to arrive)
        self.generations: dict[str, int] = {}
        self.keys: set[str] | None = None  # full clients: the names they hold (checked)
        self.in_sync = False
        self.errors: list[str] = []

    def on_status(self, status: SyncStatus) -> None:
        if status == SyncStatus.IN_SYNC and not self.in_sync:
            self.in_sync = True
            self.registry.synced()

    def on_updates(self, updates: list[RawUpdate]) -> None:
        now = time.time()
        for update in updates:
            name = update.key.name
            if self.keys is not None:
                if update.value is None:
                    self.keys.discard(name)
                else:
                    self.keys.add(name)
            if update.value is None or not name.startswith(CHURN_PREFIX):
                continue
            metadata = update.value["metadata"]
            generation = int(metadata["labels"]["generation"])
            if generation:
                written = float(metadata["annotations"][WRITTEN_AT])
                self.latencies.append((written, now - written))
            self.generations[name] = generation

    def on_error(self, error: DatastoreError) -> None:
        self.errors.append(str(error))


def _load(store: Any, plan: TyphaBenchPlan) -> None:
    docs = [_endpoint(i) for i in range(plan.endpoints - plan.churn)]
    docs += [_endpoint(i, churn=True) for i in range(plan.churn)]
    for start in range(0, len(docs), LOAD_CHUNK):
        store.apply(docs[start:start + LOAD_CHUNK])


def _direct_watches(etcd: _Etcd, count: int, timeout: float) -> float:
    """Watchers etcd holds per agent syncer reading it directly (measured on `count`)."""
    from pyfelix.agent.syncer.etcd import make_etcd_syncer

    before = etcd.watchers()
    registry = _Registry()
    syncers = []
    try:
        for _ in range(count):
            syncer = make_etcd_syncer([etcd.endpoint])
            syncer.start(_BenchClient(registry))
            syncers.append(syncer)
        if not registry.wait_in_sync(count, time.monotonic() + timeout):
            raise RuntimeError(f"direct etcd syncers not in sync after {timeout} s")
        deadline = time.monotonic() + timeout
        while etcd.watchers() - before < count and time.monotonic() < deadline:
            time.sleep(0.1)  # each watch is created just after its list
        return (etcd.watchers() - before) / count
    finally:
        for syncer in syncers:
            syncer.stop()


def churn(endpoint: str, total: int, rate: float, count: int) -> float:
    """Rewrite endpoints churn-0..count-1 round robin, `total` writes at `rate` per second,
    each stamped with the time just before its write; returns the rate achieved."""
    from pyfelix.agent.syncer.etcd_store import open_etcd_datastore

    store = open_etcd_datastore([endpoint])
    try:
        begin = time.monotonic()
        for i in range(total):
            pause = begin + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            store.apply([_endpoint(i % count, i + 1, churn=True)])
        return total / max(time.monotonic() - begin, 1e-9)
    finally:
        store.close()


def _churn_in_child(endpoint: str, total: int, plan: TyphaBenchPlan) -> float:
    """`churn` in its own process: the simulated clients' threads must not slow the writer
    (in a real cluster they are on other machines)."""
    code = ("import sys; from pyfelix.bench.typha import churn; "
            "print(churn(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    result = subprocess.run(
        [sys.executable, "-c", code, endpoint, str(total), str(plan.update_rate),
         str(plan.churn)], capture_output=True, text=True, env=env, cwd=REPO_ROOT,
        timeout=plan.update_seconds * 10 + 60, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"the churn writer failed: {result.stderr[-2000:]}")
    return float(result.stdout.strip().splitlines()[-1])


_HEAD = re.compile(rb'\{"type":"(\w+)"(?:,"seq":(\d+))?')
_CHURN_KV = re.compile(
    r'"k":\["WorkloadEndpoint","[^"]*","(' + CHURN_PREFIX + r'\d+)"\].*?"generation":"(\d+)"'
    r'.*?"' + re.escape(WRITTEN_AT) + r'":"([^"]+)"')


_FRAME_HEADER = struct.Struct("!I")


def _frame_json(message: dict[str, Any]) -> bytes:
    payload = json.dumps(message, separators=(",", ":")).encode()
    return _FRAME_HEADER.pack(len(payload)) + payload


class _CountingConnection:
    """The protocol state of one COUNTING client (see `_SimulatedClients`): it checks the
    frames' order and sequence numbers and reads the churned endpoints' generation and
    write time from the update messages' text, but decodes no snapshot chunk (it only
    inflates each frame's first bytes to learn its type and sequence number) and keeps no
    documents. Any departure from the protocol's order raises ValueError."""

    def __init__(self, callbacks: _BenchClient) -> None:
        self.callbacks = callbacks
        self.compressed = False
        self.hello = False
        self.snapshot_seq: int | None = None
        self.chunks_expected = 0
        self.chunks = 0
        self.last_seq = -1  # the newest sequence number seen after the snapshot
        self.frames = 0

    def _inflate(self, payload: bytes, limit: int = 0) -> bytes:
        if not self.compressed:
            return payload if not limit else payload[:limit]
        inflater = zlib.decompressobj()
        return inflater.decompress(payload, limit) if limit else inflater.decompress(payload)

    def handle(self, payload: bytes) -> dict[str, Any] | None:
        """One payload; returns a message to send back (a pong) or None."""
        self.frames += 1
        kind, seq, message, churned = self._parse(payload)
        if kind == "kvs" and seq is None:  # a snapshot chunk: count it, decode nothing
            if self.snapshot_seq is None or self.chunks >= self.chunks_expected:
                raise ValueError(f"frame {self.frames}: unexpected snapshot chunk")
            self.chunks += 1
            return None
        if kind == "server_hello":
            self.hello = True
            self.callbacks.registry.hello()
        elif kind == "decoder_restart":
            self.compressed = message is not None and message["compression"] == "zlib"
        elif kind == "snapshot_begin":
            assert message is not None
            self.snapshot_seq = int(message["seq"])
            self.chunks_expected = -(-int(message["kv_count"]) // SNAPSHOT_CHUNK_KVS)
        elif kind == "snapshot_end":
            if seq != self.snapshot_seq or self.chunks != self.chunks_expected:
                raise ValueError(f"snapshot_end at {seq} after {self.chunks} chunks; expected "
                                 f"{self.snapshot_seq} after {self.chunks_expected}")
            self.last_seq = seq - 1  # the status at the snapshot's seq follows
        elif kind in ("kvs", "status"):
            if seq is None or seq <= self.last_seq or self.last_seq < 0:
                raise ValueError(f"frame {self.frames}: {kind} with seq {seq} after "
                                 f"{self.last_seq}")
            self.last_seq = seq
            if kind == "status":
                assert message is not None
                self.callbacks.on_status(SyncStatus(message["status"]))
            else:
                now = time.time()
                callbacks = self.callbacks
                for name, generation, written in churned:
                    if generation:
                        callbacks.latencies.append((written, now - written))
                    callbacks.generations[name] = generation
        elif kind == "ping":
            assert message is not None
            return {"type": "pong", "timestamp": message.get("timestamp")}
        elif kind == "error":
            assert message is not None
            if message.get("code") in RETRYABLE_REFUSALS:  # tried again before the hello
                raise ConnectionError(f"server refused: {message}")
            raise ValueError(f"server error: {message}")
        return None

    def _parse(self, payload: bytes) -> _Parsed:
        """(type, seq, the message unless a kvs, churned endpoints of a kvs). The server
        sends the same bytes to every client at the same place in its log, so a payload's
        parse is kept (per process, `_PARSED`) for the other clients that receive the same
        bytes: the same bytes mean the same thing. Snapshot chunks are not kept (big, and
        only their first bytes are inflated)."""
        key = (self.compressed, payload) if len(payload) <= _PARSE_CACHE_MAX_BYTES else None
        if key is not None:
            cached = _PARSED.get(key)
            if cached is not None:
                return cached
        head = _HEAD.match(self._inflate(payload, 64))
        if head is None:
            raise ValueError(f"frame {self.frames} does not start with a type")
        kind = head.group(1).decode()
        seq = int(head.group(2)) if head.group(2) else None
        message = None
        churned: list[tuple[str, int, float]] = []
        if kind == "kvs" and seq is not None:
            churned = _churned(self._inflate(payload).decode())
        elif kind != "kvs":
            message = json.loads(self._inflate(payload))
        parsed = (kind, seq, message, churned)
        if key is not None and not (kind == "kvs" and seq is None):
            if len(_PARSED) >= _PARSE_CACHE_ENTRIES:
                _PARSED.pop(next(iter(_PARSED)))
            _PARSED[key] = parsed
        return parsed


_Parsed = tuple[str, "int | None", "dict[str, Any] | None", "list[tuple[str, int, float]]"]
_PARSED: dict[tuple[bool, bytes], _Parsed] = {}
_PARSE_CACHE_ENTRIES = 256
_PARSE_CACHE_MAX_BYTES = 256 * 1024


def _churned(text: str) -> list[tuple[str, int, float]]:
    """(name, generation, written at) of each churned endpoint in a kvs message's text."""
    found = []
    for fragment in text.split('{"k":[')[1:]:
        match = _CHURN_KV.search('"k":[' + fragment)
        if match is not None:
            found.append((match.group(1), int(match.group(2)), float(match.group(3))))
    return found


class _SimulatedClients:
    """`count` Typha clients on ONE asyncio event loop in one thread, of two sorts.

    FULL clients (`TyphaBenchPlan.full_clients` of them, `_client`) decode everything as an
    agent does; at the end each must hold every endpoint. COUNTING clients (the rest,
    `_counting_client`, `_CountingConnection`) do what an agent does on its own node only
    as far as the measurement needs: they check the order and sequence numbers of what
    they receive and read the churned endpoints' generations and write times from the
    update messages (so their latencies are real deliveries), but skip decoding snapshot
    chunks and keep no documents. Decoding 1,000 snapshots of 10,000 documents in two
    Python processes beside the server would measure those processes, not the server
    (measured: 250 full clients took 57 s to connect, the decoding starving the hellos).

    A full client speaks the protocol with the real client's pieces (`check_server_hello`,
    `StreamFollower`, `ClientState`: the same decoding, diffing and callbacks as
    `TyphaSyncer`); only the transport differs: a coroutine per connection instead of a
    thread, because 500 threads in one Python process spend their time fighting over the
    GIL (in a cluster each agent is its own process). A dropped connection is not
    reconnected: it ends that client (`errors`), and shows in the figures; only a connection
    closed before the server's hello (the server bounds how many wait for theirs) is tried
    again (also when the server refused it as full or too late for its hello), after a
    jittered backoff, up to `HANDSHAKE_RETRIES` times (`retries`).
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.errors: list[str] = []
        self.retries = 0  # connections refused before their hello, and tried again
        self._loop = asyncio.new_event_loop()
        self._tasks: list[asyncio.Task[None]] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="bench-typha-clients")
        self._thread.start()

    def add(self, hostname: str, callbacks: _BenchClient, *, full: bool = True) -> None:
        def create() -> None:
            client = self._client if full else self._counting_client
            self._tasks.append(self._loop.create_task(client(hostname, callbacks)))

        self._loop.call_soon_threadsafe(create)

    async def _client(self, hostname: str, callbacks: _BenchClient) -> None:
        from pyfelix.agent.typha.client import (
            ClientState,
            HelloRefused,
            StreamFollower,
            check_server_hello,
        )
        from pyfelix.agent.typha.protocol import (
            KNOWN_COMPRESSIONS,
            SERVER_MESSAGE_TYPES,
            FrameReader,
            MessageDecoder,
            client_hello,
            encode_message,
        )

        async def session() -> None:
            follower: StreamFollower | None = None
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            try:
                writer.write(encode_message(client_hello(
                    hostname=hostname, syncer_type="felix", compression=KNOWN_COMPRESSIONS)))
                frames = FrameReader()
                decoder = MessageDecoder(SERVER_MESSAGE_TYPES)
                state = ClientState(callbacks)
                while True:
                    data = await reader.read(256 * 1024)
                    if not data:
                        raise ConnectionError("the server closed the connection")
                    for payload in frames.feed(data):
                        message = decoder.decode(payload)
                        if follower is None:
                            check_server_hello(message, "felix", KNOWN_COMPRESSIONS)
                            follower = StreamFollower(state, f"127.0.0.1:{self.port}")
                            callbacks.registry.hello()
                            continue
                        reply = follower.handle(message)
                        if reply is not None:
                            writer.write(encode_message(reply))
            except (ConnectionError, OSError) as exc:
                raise _SessionEnded(follower is None, f"{type(exc).__name__}: {exc}") from exc
            except HelloRefused as exc:
                raise _SessionEnded(exc.code in RETRYABLE_REFUSALS,
                                    f"HelloRefused: {exc}") from exc
            finally:
                writer.close()

        await self._with_handshake_retries(hostname, session)

    async def _counting_client(self, hostname: str, callbacks: _BenchClient) -> None:
        """A counting client (`_CountingConnection`): same hello, retries and errors as
        `_client`, a fraction of its CPU."""
        async def session() -> None:
            connection = _CountingConnection(callbacks)
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            try:
                writer.write(_frame_json({"type": "client_hello", "protocol_version": 1,
                                          "hostname": hostname, "syncer_type": "felix",
                                          "compression": ["zlib", "none"],
                                          "client_version": "bench-counting"}))
                while True:
                    (length,) = _FRAME_HEADER.unpack(await reader.readexactly(4))
                    reply = connection.handle(await reader.readexactly(length))
                    if reply is not None:  # (we never restart our encoder: uncompressed)
                        writer.write(_frame_json(reply))
            except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
                raise _SessionEnded(not connection.hello, f"{type(exc).__name__}: {exc}") from exc
            finally:
                writer.close()

        await self._with_handshake_retries(hostname, session)

    async def _with_handshake_retries(self, hostname: str,
                                      session: Callable[[], Awaitable[None]]) -> None:
        """Run a client's session. One that ends before the server's hello, or whose connect
        fails (the server bounds connections waiting for their hello and refuses the rest),
        is retried after a randomised exponential backoff, as an agent's client does, up to
        HANDSHAKE_RETRIES times; any other end is recorded in `errors`. Cancellation ends
        the client quietly."""
        for attempt in itertools.count():
            try:
                await session()
                return
            except asyncio.CancelledError:
                return
            except (_SessionEnded, ConnectionError, OSError) as exc:
                ended = exc if isinstance(exc, _SessionEnded) else None
                if (ended is None or ended.retryable) and attempt < HANDSHAKE_RETRIES:
                    self.retries += 1
                    await asyncio.sleep(random.uniform(0.2, 1.0) * min(2 ** attempt, 8))
                    continue
                reason = ended.reason if ended else f"{type(exc).__name__}: {exc}"
                self.errors.append(f"{hostname}: {reason}")
                return
            except Exception as exc:
                self.errors.append(f"{hostname}: {type(exc).__name__}: {exc}")
                return

    def stop(self) -> None:
        async def cancel_all() -> None:
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=10)

        asyncio.run_coroutine_threadsafe(cancel_all(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _client_worker(port: int, names: list[str], full: set[str], wave: int, pause: float,
                   sync_timeout: float, conn: Connection) -> None:
    """A client process: start `names` in waves of `wave`, `pause` seconds apart (a wave
    does not wait for the previous one's snapshots), report ("hello", n) once every client
    got the server's hello and ("ready", n) once every one is in sync, or ("failed", why);
    then on ("drain", final generations, timeout) wait for them and report
    ("done", latencies, errors)."""
    # 250 clients' state in one process makes each cyclic-GC pass cost tens to hundreds of
    # milliseconds (measured: seconds of CPU per 10 s of updates), which a real agent, one
    # client per process, never pays: run without it (reference counting still frees
    # everything but cycles, and this process lives for minutes)
    gc.disable()
    registry = _Registry()
    callbacks: list[_BenchClient] = []
    clients = _SimulatedClients(port)
    try:
        started = time.monotonic()
        deadline = started + sync_timeout
        for first in range(0, len(names), wave):
            for name in names[first:first + wave]:
                callbacks.append(_BenchClient(registry))
                if name in full:
                    callbacks[-1].keys = set()
                clients.add(name, callbacks[-1], full=name in full)
            time.sleep(pause)
        def wait(what: str, done: Callable[[float], bool], count: Callable[[], int]) -> bool:
            """Until `done`; False (after telling the parent) at the deadline or as soon as
            a client has failed for good (a dropped client never comes back)."""
            while not done(min(deadline, time.monotonic() + 1.0)):
                if clients.errors or time.monotonic() >= deadline:
                    conn.send(("failed", f"{count()} of {len(callbacks)} clients {what} after "
                                         f"{time.monotonic() - started:.0f} s; "
                                         f"{len(clients.errors)} client(s) failed, e.g. "
                                         f"{clients.errors[:2]}"))
                    return False
            return True

        if not wait("had the server's hello",
                    lambda until: registry.wait_hellos(len(callbacks), until),
                    lambda: registry.hellos):
            return
        conn.send(("hello", len(callbacks)))
        if not wait("were in sync", lambda until: registry.wait_in_sync(len(callbacks), until),
                    lambda: registry.in_sync):
            return
        conn.send(("ready", len(callbacks)))
        _, final, drain_timeout = conn.recv()
        drain_deadline = time.monotonic() + drain_timeout
        while time.monotonic() < drain_deadline:
            if all(c.generations.get(k) == g for c in callbacks for k, g in final.items()):
                break
            time.sleep(0.1)
        held = [len(c.keys) for c in callbacks if c.keys is not None]
        conn.send(("done", [v for c in callbacks for v in c.latencies], clients.errors,
                   clients.retries, held))
        try:
            conn.recv()  # stay connected until the parent has read the server's metrics
        except EOFError:
            pass
    finally:
        clients.stop()
        conn.close()


class _ClientProcesses:
    """The simulated clients, split over `count` processes (see TyphaBenchPlan)."""

    def __init__(self, port: int, plan: TyphaBenchPlan) -> None:
        context = multiprocessing.get_context("spawn")
        self.processes: list[BaseProcess] = []
        self.pipes: list[Connection] = []
        count = max(1, min(plan.client_processes, plan.clients))
        wave = max(1, plan.wave // count)
        pause = plan.wave / plan.connect_rate
        for index in range(count):
            names = [f"bench-{n}" for n in range(index, plan.clients, count)]
            full = {f"bench-{n}" for n in range(index, min(plan.full_clients, plan.clients),
                                                count)}
            parent, child = context.Pipe()
            process = context.Process(target=_client_worker, daemon=True,
                                      args=(port, names, full, wave, pause, plan.sync_timeout,
                                            child),
                                      name=f"bench-typha-clients-{index}")
            process.start()
            child.close()
            self.processes.append(process)
            self.pipes.append(parent)

    def _receive(self, pipe: Connection, timeout: float) -> tuple[Any, ...]:
        if not pipe.poll(timeout):
            raise RuntimeError(f"a client process said nothing within {timeout} s")
        message: tuple[Any, ...] = pipe.recv()
        if message[0] == "failed":
            raise RuntimeError(f"a client process failed: {message[1]}")
        return message

    def wait_for(self, what: str, timeout: float) -> int:
        """Clients of every process that reported `what` ("hello" or "ready")."""
        deadline = time.monotonic() + timeout
        total = 0
        for pipe in self.pipes:
            message = self._receive(pipe, max(deadline - time.monotonic(), 0.1))
            if message[0] != what:
                raise RuntimeError(f"a client process said {message[0]!r}, not {what!r}")
            total += message[1]
        return int(total)

    def drain(self, final: dict[str, int], timeout: float
              ) -> tuple[list[tuple[float, float]], list[str], int, list[int]]:
        """(written at, latency) of every delivery, the clients' errors, how many
        connections were refused before their hello and tried again, and the number of
        keys each full client holds."""
        for pipe in self.pipes:
            pipe.send(("drain", final, timeout))
        latencies: list[tuple[float, float]] = []
        errors: list[str] = []
        retries = 0
        held: list[int] = []
        for pipe in self.pipes:
            _, got, failures, refused, keys = self._receive(pipe, timeout + 30)
            latencies += got
            errors += failures
            retries += refused
            held += keys
        return latencies, errors, retries, held

    def stop(self) -> None:
        for pipe in self.pipes:
            pipe.close()
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join(10)


def run_typha_bench(plan: TyphaBenchPlan) -> Figures:
    from pyfelix.agent.syncer.etcd_store import open_etcd_datastore

    workdir = Path(tempfile.mkdtemp(prefix="pyfelix-bench-typha-"))
    clients: _ClientProcesses | None = None
    etcd: _Etcd | None = None
    server: _Server | None = None
    store = None
    try:
        etcd = _retry_port_race(lambda: _Etcd(workdir))
        store = open_etcd_datastore([etcd.endpoint])
        _load(store, plan)
        server = _retry_port_race(lambda: _Server(f"etcd3://{etcd.endpoint}",
                                                  workdir / "typha.log", plan.sync_timeout,
                                                  plan.endpoints))
        started = time.monotonic()
        clients = _ClientProcesses(server.port, plan)
        clients.wait_for("hello", plan.sync_timeout + 60)
        connect_seconds = time.monotonic() - started
        connected = clients.wait_for("ready", plan.sync_timeout + 60)
        in_sync_seconds = time.monotonic() - started
        watches_with_typha = etcd.watchers()

        total = round(plan.update_rate * plan.update_seconds)
        achieved_rate = _churn_in_child(etcd.endpoint, total, plan)
        final = {f"{CHURN_PREFIX}{i % plan.churn}": i + 1 for i in range(total)}
        deliveries, errors, retries, held = clients.drain(final, plan.drain_timeout)
        latencies = [latency for _, latency in deliveries]
        wrong = [keys for keys in held if keys != plan.endpoints]
        if wrong:
            raise RuntimeError(f"full clients hold {wrong} keys, not {plan.endpoints}: the "
                               "content they decoded is wrong")

        metrics = server.metrics()
        rss, peak = _rss_mb(server.process.pid)
        if not latencies:
            raise RuntimeError("no update reached any client")
        per_direct_client = _direct_watches(etcd, plan.direct_sample, plan.sync_timeout)
        return {
            "clients": float(connected),
            "client_processes": float(len(clients.processes)),
            "full_clients": float(len(held)),
            "clients_connected_at_end": _sample(metrics, "typha_connections_active",
                                                'syncer_type="felix"') or 0.0,
            "endpoints": _sample(metrics, "typha_snapshot_size", 'syncer_type="felix"')
            or math.nan,
            "updates": float(total),
            "update_rate_achieved": achieved_rate,
            "fanout_p50_ms": _percentile(latencies, 0.50) * 1000,
            "fanout_p99_ms": _percentile(latencies, 0.99) * 1000,
            "fanout_max_ms": max(latencies) * 1000,
            "missing_deliveries": float(total * connected - len(latencies)),
            "client_errors": float(len(errors)),
            "handshake_retries": float(retries),
            "server_fanout_p99_ms": _histogram_p99(metrics, "typha_updates_fanout_latency")
            * 1000,
            "server_rss_mb": rss,
            "server_peak_rss_mb": peak,
            "connect_seconds": connect_seconds,
            "in_sync_seconds": in_sync_seconds,
            "etcd_watches_with_typha": watches_with_typha,
            "etcd_watches_per_direct_client": per_direct_client,
            "etcd_watches_without_typha": per_direct_client * connected,
        }
    finally:
        if clients is not None:
            clients.stop()
        if server is not None:
            server.stop()
        if store is not None:
            store.close()
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _is_quick(ctx: BenchContext) -> bool:
    return ctx.settings.min_sample_seconds < 0.01


SWEPT_FIGURES = ("fanout_p50_ms", "fanout_p99_ms", "connect_seconds", "in_sync_seconds",
                 "server_rss_mb", "server_peak_rss_mb", "missing_deliveries", "client_errors",
                 "handshake_retries")


def run_sweep(base: TyphaBenchPlan, counts: tuple[int, ...],
              ctx: BenchContext | None = None) -> Figures:
    """One run per client count: the largest completed run's figures as they are, and the
    latency, timing and memory figures of every run suffixed `_<clients>` (for the chart).
    A count that fails gets a note `clients_<count>` with the reason, and no figures."""
    figures: Figures = {}
    for count in sorted(counts):
        try:
            run = run_typha_bench(replace(base, clients=count))
        except RuntimeError as exc:
            if ctx is None:
                raise
            ctx.note(f"clients_{count}", f"FAILED: {exc}")
            continue
        figures.update({f"{name}_{count}": run[name] for name in SWEPT_FIGURES})
        figures.update(run)  # the largest run that completed
    if not figures:
        raise RuntimeError(f"no client count completed: {ctx.notes if ctx else ''}")
    return figures


@benchmark("typha", description="Typha fan-out: 250/500/1,000 clients, 10,000 endpoints, "
                                "100 updates/s")
def typha_bench(ctx: BenchContext) -> Figures:
    if _is_quick(ctx):
        return run_sweep(TyphaBenchPlan.quick(), QUICK_CLIENT_SWEEP, ctx)
    return run_sweep(TyphaBenchPlan(), CLIENT_SWEEP, ctx)
