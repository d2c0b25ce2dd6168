"""A small in-process fake of the Kubernetes API server, for the Kubernetes datastore tests.

No kube-apiserver can be installed on the test machines, so this fake speaks the parts of
the HTTP protocol the datastore uses, the way the real server does:

- paths: `/api/v1/[namespaces/<ns>/]<plural>[/<name>]` and
  `/apis/<group>/<version>/[namespaces/<ns>/]<plural>[/<name>]`; an unknown type is 404;
- one cluster-wide resourceVersion counter (like etcd's revision) stamped on every write;
- list: `{"kind": "<Kind>List", "metadata": {"resourceVersion", "continue"}, "items"}`,
  paged with `limit`/`continue`, every page from the snapshot of the first page; items of
  built-in types come WITHOUT apiVersion/kind (as the real server sends them), CRD items
  with; an expired continue token (its snapshot compacted away) is `410 Gone`
  (reason Expired);
- watch (`?watch=true&resourceVersion=RV`): HTTP 200 with a chunked body of JSON lines
  `{"type": "ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR", "object": {...}}`, replaying
  every event after RV, then live ones, until `timeoutSeconds`; RV older than the last
  compaction -> a single ERROR event whose object is a `Status` with code 410 (reason
  Expired, "too old resource version"); BOOKMARK events (object: kind, apiVersion and
  only `metadata.resourceVersion`) are sent only to watches that asked with
  `allowWatchBookmarks=true`, when the test calls `send_bookmarks()`;
- create (POST, 409 AlreadyExists), replace (PUT, 409 Conflict on a stale
  metadata.resourceVersion, 422 without one), delete (DELETE, 404 NotFound);
- `Authorization: Bearer <token>` required (401 otherwise).

Test controls: `cluster` (create/update/delete objects as other clients would),
`compact()` (forget history: older resourceVersions become 410), `send_bookmarks()`,
`break_watches()` (drop every open watch connection mid-stream), `partition()` /
`heal()` (answer every request with 503 meanwhile), `after_list_page` (a hook run after a
list page is served), and `requests` (a log of (method, path, query) received).
"""

from __future__ import annotations

import base64
import copy
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "fake-kube-token"


@dataclass(frozen=True)
class ServedType:
    group_version: str
    plural: str
    kind: str
    namespaced: bool
    crd: bool = False  # custom resources: list items keep apiVersion/kind


DEFAULT_TYPES = (
    ServedType("v1", "namespaces", "Namespace", False),
    ServedType("v1", "serviceaccounts", "ServiceAccount", True),
    ServedType("v1", "pods", "Pod", True),
    ServedType("v1", "nodes", "Node", False),
    ServedType("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True),
    ServedType("v1", "services", "Service", True),
    ServedType("discovery.k8s.io/v1", "endpointslices", "EndpointSlice", True),
    ServedType("v1", "secrets", "Secret", True),
    *(ServedType("crd.projectcalico.org/v1", plural, kind, namespaced, crd=True)
      for plural, kind, namespaced in (
          ("tiers", "Tier", False), ("globalnetworkpolicies", "GlobalNetworkPolicy", False),
          ("networkpolicies", "NetworkPolicy", True),
          ("globalnetworksets", "GlobalNetworkSet", False),
          ("networksets", "NetworkSet", True), ("hostendpoints", "HostEndpoint", False),
          ("ippools", "IPPool", False), ("bgpconfigurations", "BGPConfiguration", False),
          ("bgppeers", "BGPPeer", False), ("bgpfilters", "BGPFilter", False),
          ("felixconfigurations", "FelixConfiguration", False),
          ("blockaffinities", "BlockAffinity", False))),
)


@dataclass(frozen=True)
class _Event:
    version: int
    type: str
    served: ServedType
    obj: dict[str, Any]


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status_object(code, reason, message)
        self.code = code


class FakeCluster:
    """The stored objects, their history, and the resourceVersion counter. Thread-safe."""

    def __init__(self, types: tuple[ServedType, ...] = DEFAULT_TYPES) -> None:
        self.types = types
        self.changed = threading.Condition()
        self.version = 1000
        self._objects: dict[ServedType, dict[tuple[str, str], dict[str, Any]]] = {
            t: {} for t in types}
        self._history: list[_Event] = []
        self.compacted_version = self.version
        self._base: dict[ServedType, dict[tuple[str, str], dict[str, Any]]] = {
            t: {} for t in types}

    def served(self, group_version: str, plural: str) -> ServedType:
        for served in self.types:
            if served.group_version == group_version and served.plural == plural:
                return served
        raise ApiError(404, "NotFound", f"the server could not find the requested resource "
                                        f"({group_version}/{plural})")

    def find_type(self, kind: str, group_version: str) -> ServedType:
        for served in self.types:
            if served.kind == kind and served.group_version == group_version:
                return served
        raise KeyError(f"{group_version} {kind} is not served")

    # -- writes (through the API or directly from a test) --

    def _record(self, served: ServedType, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self._history.append(_Event(self.version, kind, served, copy.deepcopy(obj)))
        self.changed.notify_all()
        return copy.deepcopy(obj)

    def _slot(self, served: ServedType, obj: dict[str, Any],
              namespace: str | None = None) -> tuple[str, str]:
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if served.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
            return meta["namespace"], name
        meta.pop("namespace", None)
        return "", name

    def create(self, served: ServedType, obj: dict[str, Any],
               namespace: str | None = None) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        with self.changed:
            slot = self._slot(served, obj, namespace)
            if slot in self._objects[served]:
                raise ApiError(409, "AlreadyExists",
                               f'{served.plural} "{slot[1]}" already exists')
            obj["apiVersion"] = served.group_version
            obj["kind"] = served.kind
            obj["metadata"]["uid"] = str(uuid.uuid4())
            obj["metadata"]["creationTimestamp"] = "2024-01-01T00:00:00Z"
            obj["metadata"]["managedFields"] = [{"manager": "fake", "operation": "Update"}]
            self._objects[served][slot] = obj
            return self._record(served, "ADDED", obj)

    def replace(self, served: ServedType, obj: dict[str, Any],
                namespace: str | None = None, *, check_version: bool = True
                ) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        with self.changed:
            slot = self._slot(served, obj, namespace)
            current = self._objects[served].get(slot)
            if current is None:
                raise ApiError(404, "NotFound", f'{served.plural} "{slot[1]}" not found')
            given = obj["metadata"].get("resourceVersion")
            if check_version and not given:
                raise ApiError(422, "Invalid", "metadata.resourceVersion: Invalid value: "
                                               "0x0: must be specified for an update")
            if check_version and given != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on '
                                                f'{served.plural} "{slot[1]}": the object has '
                                                'been modified; please apply your changes to '
                                                'the latest version and try again')
            obj["apiVersion"] = served.group_version
            obj["kind"] = served.kind
            for field in ("uid", "creationTimestamp", "managedFields"):
                obj["metadata"][field] = current["metadata"][field]
            self._objects[served][slot] = obj
            return self._record(served, "MODIFIED", obj)

    def delete(self, served: ServedType, namespace: str, name: str) -> dict[str, Any]:
        with self.changed:
            slot = (namespace if served.namespaced else "", name)
            current = self._objects[served].pop(slot, None)
            if current is None:
                raise ApiError(404, "NotFound", f'{served.plural} "{name}" not found')
            return self._record(served, "DELETED", copy.deepcopy(current))

    def get(self, served: ServedType, namespace: str, name: str) -> dict[str, Any]:
        with self.changed:
            current = self._objects[served].get((namespace if served.namespaced else "", name))
            if current is None:
                raise ApiError(404, "NotFound", f'{served.plural} "{name}" not found')
            return copy.deepcopy(current)

    # Convenience for tests: by kind and apiVersion of the object itself.
    def put_object(self, obj: dict[str, Any]) -> dict[str, Any]:
        served = self.find_type(obj["kind"], obj["apiVersion"])
        meta = obj.get("metadata", {})
        slot = (meta.get("namespace", "default") if served.namespaced else "", meta["name"])
        with self.changed:
            exists = slot in self._objects[served]
        if exists:
            return self.replace(served, obj, check_version=False)
        return self.create(served, obj)

    def delete_object(self, kind: str, group_version: str, name: str,
                      namespace: str = "") -> dict[str, Any]:
        return self.delete(self.find_type(kind, group_version), namespace, name)

    def compact(self) -> int:
        """Forget the history: resourceVersions before now become 410 Gone."""
        with self.changed:
            self._base = {t: copy.deepcopy(objs) for t, objs in self._objects.items()}
            self._history.clear()
            self.compacted_version = self.version
            return self.version

    # -- reads --

    def snapshot(self, served: ServedType, version: int) -> dict[tuple[str, str], dict]:
        """The objects of a type as they were at `version` (>= the compaction point)."""
        with self.changed:
            if version < self.compacted_version:
                raise ApiError(410, "Expired", "The provided continue parameter is too old to "
                                               "display a consistent list result. You can "
                                               "start a new list without the continue "
                                               "parameter.")
            state = copy.deepcopy(self._base[served])
            for event in self._history:
                if event.version > version:
                    break
                if event.served != served:
                    continue
                meta = event.obj["metadata"]
                slot = (meta.get("namespace", ""), meta["name"])
                if event.type == "DELETED":
                    state.pop(slot, None)
                else:
                    state[slot] = copy.deepcopy(event.obj)
            return state

    def events_after(self, served: ServedType, version: int) -> list[_Event]:
        with self.changed:
            return [e for e in self._history if e.version > version and e.served == served]


class FakeKubeAPIServer:
    """The HTTP front of a FakeCluster on 127.0.0.1 (see module docstring)."""

    def __init__(self, cluster: FakeCluster | None = None, *, token: str = TOKEN) -> None:
        self.cluster = cluster or FakeCluster()
        self.token = token
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.after_list_page: Callable[[], None] | None = None
        self._partitioned = False
        self._bookmark_round = 0
        self._break_round = 0
        self._closing = False
        self._open_watches: set[socket.socket] = set()
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = _Server(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        daemon=True, name="fake-kube-apiserver")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> FakeKubeAPIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.cluster.changed:
            self._closing = True
            self.cluster.changed.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._abort_watches()

    def write_kubeconfig(self, path: str) -> str:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
        }
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        return path

    # -- test controls --

    def send_bookmarks(self) -> None:
        with self.cluster.changed:
            self._bookmark_round += 1
            self.cluster.changed.notify_all()

    def break_watches(self) -> None:
        with self.cluster.changed:
            self._break_round += 1
            self.cluster.changed.notify_all()
        self._abort_watches()

    def partition(self) -> None:
        self._partitioned = True
        self.break_watches()

    def heal(self) -> None:
        self._partitioned = False

    def watch_count(self) -> int:
        with self._lock:
            return len(self._open_watches)

    def _abort_watches(self) -> None:
        with self._lock:
            sockets = list(self._open_watches)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # every watcher reconnects at once after break_watches()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeKubeAPIServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing --

    def _send_json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body is not an object")
        return body

    def _route(self) -> tuple[ServedType, str, str, dict[str, str]]:
        """(type, namespace or "", name or "", query) of the request path."""
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        parts = [p for p in split.path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group_version, rest = "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise ApiError(404, "NotFound", f"no route for {split.path}")
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 2:
            raise ApiError(404, "NotFound", f"no route for {split.path}")
        served = self.fake.cluster.served(group_version, rest[0])
        if namespace and not served.namespaced:
            raise ApiError(404, "NotFound", f"{served.plural} is not namespaced")
        return served, namespace, rest[1] if len(rest) == 2 else "", query

    def _handle(self, method: str) -> None:
        try:
            self.fake.requests.append((method, urlsplit(self.path).path,
                                       {k: v[-1] for k, v in
                                        parse_qs(urlsplit(self.path).query).items()}))
            if self.headers.get("Authorization") != f"Bearer {self.fake.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if self.fake._partitioned:
                raise ApiError(503, "ServiceUnavailable",
                               "the server is currently unable to handle the request")
            served, namespace, name, query = self._route()
            if method == "GET" and not name and query.get("watch") in ("true", "1"):
                self._watch(served, namespace, query)
            elif method == "GET" and not name:
                self._send_json(200, self._list(served, namespace, query))
            elif method == "GET":
                self._send_json(200, self.fake.cluster.get(served, namespace, name))
            elif method == "POST" and not name:
                self._send_json(201, self.fake.cluster.create(served, self._read_body(),
                                                              namespace or None))
            elif method == "PUT" and name:
                body = self._read_body()
                if body.get("metadata", {}).get("name") != name:
                    raise ApiError(400, "BadRequest", "the name of the object does not "
                                                      "match the name in the URL")
                self._send_json(200, self.fake.cluster.replace(served, body, namespace or None))
            elif method == "DELETE" and name:
                self.fake.cluster.delete(served, namespace, name)
                self._send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                      "status": "Success"})
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} not allowed here")
        except ApiError as exc:
            self._send_json(exc.code, exc.status)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # -- list --

    def _list(self, served: ServedType, namespace: str, query: dict[str, str]
              ) -> dict[str, Any]:
        cluster = self.fake.cluster
        token = query.get("continue")
        if token:
            try:
                decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
                version, after = int(decoded["rv"]), tuple(decoded["after"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ApiError(400, "BadRequest", f"invalid continue token: {exc}") from exc
        else:
            with cluster.changed:
                version, after = cluster.version, ()
        state = cluster.snapshot(served, version)
        slots = sorted(slot for slot in state
                       if (not namespace or slot[0] == namespace) and slot > after)
        limit = int(query.get("limit") or 0)
        page = slots[:limit] if limit else slots
        items = []
        for slot in page:
            item = copy.deepcopy(state[slot])
            if not served.crd:  # the real server leaves these out of list items
                item.pop("apiVersion", None)
                item.pop("kind", None)
            items.append(item)
        metadata: dict[str, Any] = {"resourceVersion": str(version)}
        if limit and len(slots) > limit:
            next_token = {"rv": version, "after": list(page[-1])}
            metadata["continue"] = base64.urlsafe_b64encode(
                json.dumps(next_token).encode()).decode()
        hook = self.fake.after_list_page
        if hook is not None:
            hook()
        return {"kind": f"{served.kind}List", "apiVersion": served.group_version,
                "metadata": metadata, "items": items}

    # -- watch --

    def _write_chunk(self, event: dict[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, served: ServedType, namespace: str, query: dict[str, str]) -> None:
        fake = self.fake
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        requested = query.get("resourceVersion") or ""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with fake._lock:
            fake._open_watches.add(self.connection)
        try:
            self._stream_events(served, namespace, requested, bookmarks, timeout)
            self.wfile.write(b"0\r\n\r\n")  # a normal end of the stream
            self.wfile.flush()
        except (OSError, _Broken):
            self.close_connection = True
        finally:
            with fake._lock:
                fake._open_watches.discard(self.connection)

    def _stream_events(self, served: ServedType, namespace: str, requested: str,
                       bookmarks: bool, timeout: float) -> None:
        """Write the watch's events until its timeout; chunks are prepared under the
        cluster lock and written after it is released (a slow reader never blocks writes)."""
        fake = self.fake
        cluster = fake.cluster
        pending: list[dict[str, Any]] = []
        with cluster.changed:
            bookmark_round, break_round = fake._bookmark_round, fake._break_round
            if requested in ("", "0"):  # "start at most recent": synthetic ADDED first
                cursor = cluster.version
                for obj in cluster.snapshot(served, cursor).values():
                    if not namespace or obj["metadata"].get("namespace") == namespace:
                        pending.append({"type": "ADDED", "object": obj})
            else:
                cursor = int(requested)
                if cursor < cluster.compacted_version:
                    pending.append({"type": "ERROR", "object": status_object(
                        410, "Expired", f"too old resource version: {cursor} "
                                        f"({cluster.compacted_version})")})
        for event in pending:
            self._write_chunk(event)
        if pending and pending[0]["type"] == "ERROR":
            return
        deadline = time.monotonic() + timeout
        while True:
            pending = []
            with cluster.changed:
                if fake._closing or fake._break_round != break_round:
                    raise _Broken()
                for event in cluster.events_after(served, cursor):
                    cursor = event.version
                    if not namespace or event.obj["metadata"].get("namespace") == namespace:
                        pending.append({"type": event.type, "object": event.obj})
                if bookmarks and fake._bookmark_round != bookmark_round:
                    bookmark_round = fake._bookmark_round
                    cursor = max(cursor, cluster.version)
                    pending.append({"type": "BOOKMARK", "object": {
                        "kind": served.kind, "apiVersion": served.group_version,
                        "metadata": {"resourceVersion": str(cursor)}}})
                remaining = deadline - time.monotonic()
                idle = not pending and not cluster.events_after(served, cursor) and (
                    not bookmarks or fake._bookmark_round == bookmark_round)
                if idle and remaining > 0:
                    cluster.changed.wait(min(remaining, 0.5))
            for event in pending:
                self._write_chunk(event)
            if remaining <= 0:
                return


class _Broken(Exception):
    """The test broke this watch: end it without the final chunk."""

