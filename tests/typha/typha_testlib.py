"""Helpers for the Typha tests: documents, a datastore writer that knows the truth, a
recording client callback, bounded waits, and raw protocol sockets.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from pyfelix.agent.syncer.api import DatastoreError, RawUpdate, ResourceKey, SyncStatus, key_of
from pyfelix.agent.typha.protocol import (
    FRAME_HEADER,
    SERVER_MESSAGE_TYPES,
    FrameReader,
    MessageDecoder,
    client_hello,
    encode_message,
)

CALICO = "projectcalico.org/v3"


def wep(name: str, namespace: str = "default", *, node: str = "node1", ip: str = "10.65.0.1",
        labels: dict[str, str] | None = None, padding: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": CALICO, "kind": "WorkloadEndpoint",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"node": node, "orchestrator": "k8s", "workload": name, "endpoint": "eth0",
                 "interfaceName": f"cali{abs(hash(name)) % 10**8:08d}",
                 "ipNetworks": [f"{ip}/32"]},
    }
    if padding:
        # random: compression must not shrink it away
        doc["metadata"]["annotations"] = {"test/padding": os.urandom(padding // 2).hex()}
    return doc


def gnp(name: str, selector: str = "all()") -> dict[str, Any]:
    return {"apiVersion": CALICO, "kind": "GlobalNetworkPolicy", "metadata": {"name": name},
            "spec": {"selector": selector}}


def ippool(name: str, cidr: str) -> dict[str, Any]:
    return {"apiVersion": CALICO, "kind": "IPPool", "metadata": {"name": name},
            "spec": {"cidr": cidr}}


def bgp_peer(name: str, ip: str, asn: int = 64512) -> dict[str, Any]:
    return {"apiVersion": CALICO, "kind": "BGPPeer", "metadata": {"name": name},
            "spec": {"peerIP": ip, "asNumber": asn}}


def node(name: str, ip: str) -> dict[str, Any]:
    return {"apiVersion": CALICO, "kind": "Node", "metadata": {"name": name},
            "spec": {"bgp": {"ipv4Address": f"{ip}/24"}}}


class FileStore:
    """Writes a file datastore directory one resource per file (atomically, by rename) and
    keeps the truth: `state` is what the datastore holds."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.state: dict[ResourceKey, dict[str, Any]] = {}

    def _path(self, key: ResourceKey) -> Path:
        return self.root / f"{key.kind}.{key.namespace or '_'}.{key.name}.yaml"

    def put(self, *docs: dict[str, Any]) -> None:
        for doc in docs:
            key = key_of(doc)
            path = self._path(key)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
            os.replace(tmp, path)
            self.state[key] = doc

    def delete(self, *keys: ResourceKey) -> None:
        for key in keys:
            self._path(key).unlink()
            del self.state[key]

    def expected(self, kinds: frozenset[str] | None = None) -> dict[ResourceKey, dict]:
        return {k: v for k, v in self.state.items() if kinds is None or k.kind in kinds}


class Recorder:
    """SyncerCallbacks keeping the merged state, statuses and errors; a delete of a key it
    does not hold, or an update of a key whose value did not change, is recorded as a
    violation (the client must never send either)."""

    def __init__(self, *, block: threading.Event | None = None) -> None:
        self.cond = threading.Condition()
        self.state: dict[ResourceKey, dict[str, Any]] = {}
        self.statuses: list[SyncStatus] = []
        self.errors: list[DatastoreError] = []
        self.violations: list[str] = []
        self.deletes: list[ResourceKey] = []
        self.update_count = 0
        self._block = block  # while set... cleared: callbacks block (a slow consumer)

    def on_status(self, status: SyncStatus) -> None:
        with self.cond:
            self.statuses.append(status)
            self.cond.notify_all()

    def on_updates(self, updates: list[RawUpdate]) -> None:
        if self._block is not None:
            self._block.wait(30)
        with self.cond:
            for update in updates:
                self.update_count += 1
                if update.value is None:
                    if update.key not in self.state:
                        self.violations.append(f"delete of unknown key {update.key}")
                    self.state.pop(update.key, None)
                    self.deletes.append(update.key)
                else:
                    if self.state.get(update.key) == update.value:
                        self.violations.append(f"unchanged update of {update.key}")
                    self.state[update.key] = update.value
            self.cond.notify_all()

    def on_error(self, error: DatastoreError) -> None:
        with self.cond:
            self.errors.append(error)
            self.cond.notify_all()

    @property
    def status(self) -> SyncStatus | None:
        with self.cond:
            return self.statuses[-1] if self.statuses else None

    def wait_for(self, condition: Callable[[Recorder], bool], what: str,
                 timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not condition(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout} s waiting for {what}; "
                                         f"status {self.statuses[-1:]}, {len(self.state)} keys, "
                                         f"errors {self.errors[-3:]}")
                self.cond.wait(min(left, 0.2))

    def wait_converged(self, expected: dict[ResourceKey, dict], what: str = "convergence",
                       timeout: float = 15.0) -> None:
        self.wait_for(lambda r: r.statuses[-1:] == [SyncStatus.IN_SYNC]
                      and r.state == expected, what, timeout)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class RawClient:
    """A hand-driven protocol peer: send any bytes, read frames and decode messages."""

    def __init__(self, address: tuple[str, int], *, receive_buffer: int | None = None,
                 timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect(address)
        self.frames = FrameReader()
        self.decoder = MessageDecoder(SERVER_MESSAGE_TYPES)
        self.payloads: list[bytes] = []

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, message: dict[str, Any]) -> None:
        self.send_raw(encode_message(message))

    def hello(self, syncer_type: str = "felix", *, compression: Iterable[str] = ("none",),
              version: int = 1) -> dict[str, Any]:
        self.send(client_hello(hostname="raw", syncer_type=syncer_type,
                               compression=compression, protocol_version=version))
        return self.message()

    def payload(self) -> bytes:
        """The next raw payload (no decoding); raises EOFError when the server closed."""
        while not self.payloads:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("server closed the connection")
            self.payloads.extend(self.frames.feed(data))
        return self.payloads.pop(0)

    def message(self) -> dict[str, Any]:
        return self.decoder.decode(self.payload())

    def messages_until(self, kind: str, limit: int = 10_000) -> list[dict[str, Any]]:
        seen = []
        for _ in range(limit):
            message = self.message()
            seen.append(message)
            if message["type"] == kind:
                return seen
        raise AssertionError(f"no {kind} message within {limit} messages")

    def closed_by_server(self, timeout: float = 5.0) -> bool:
        """Read until EOF (True) or timeout (False), discarding data."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def frame_bytes(payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload)) + payload


def json_frame(message: Any, compression: str = "none") -> bytes:
    data = json.dumps(message).encode()
    return frame_bytes(zlib.compress(data) if compression == "zlib" else data)


