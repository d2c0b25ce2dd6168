"""The Kubernetes datastore syncer: list + watch every resource type pyfelix reads.

Role: implements `agent.syncer.api.Syncer` for `--datastore kubernetes`, over the API
server's list/watch protocol (`agent.syncer.kube_api`), for the types of
`agent.syncer.kube_resources.resource_types(syncer_type)` (Pods of every node, Namespaces,
ServiceAccounts, Nodes, NetworkPolicies and Calico's CRDs, converted to v3 documents; for
confd, the "bgp" syncer type, also the Secrets of the one secret namespace).

Inputs: a `KubeAPI` (in-cluster config or KUBECONFIG). Outputs, from the syncer thread:
`RawUpdate`s (source `kubernetes:<path>/<name>`, revision = the object's
resourceVersion), statuses, and `DatastoreError`s for objects that cannot be keyed.

How each type is followed (one thread per type, like Calico's watcher caches):
1. List in pages (`limit` + `continue`; every page is from the snapshot of the first).
   Send the difference from what was sent before: objects whose resourceVersion changed,
   deletes for objects that vanished. A `410 Gone` on a continue token restarts the list.
2. Watch from the list's resourceVersion with `allowWatchBookmarks=true` and a server-side
   `timeoutSeconds`; ADDED/MODIFIED/DELETED become updates, every event (BOOKMARK too)
   advances the resourceVersion to resume from.
3. The stream ends (the server's timeout) -> watch again from the last resourceVersion.
   The stream breaks or the request fails -> jittered backoff, then the same.
4. `410 Gone` (an ERROR event whose Status has code 410, or an HTTP 410): the server no
   longer has the history since our resourceVersion -> relist (step 1, with deletes),
   counted in `pyfelix_datastore_resyncs_total{backend="kubernetes",reason="expired"}`.
5. A type the server does not serve (404, e.g. a Calico CRD not installed) counts as
   empty and is listed again every `missing_type_retry` seconds.

Statuses: WAIT_FOR_DATASTORE until the first list answer, RESYNC while any type lists
(at start or after a 410), IN_SYNC once every type has listed (after a 410 relist, once
no type has been relisting for `resync_settle` s, so one outage gives one RESYNC). A
watch restarted from its last resourceVersion is NOT a resync: the server replays
everything since (as client-go's reflector relies on); the state held is complete as of
that resourceVersion.

Hostile input: every object is checked (`agent.inputs.check_document`: size, depth,
members, duplicate keys) before anything copies it; one that breaks a limit is reported
(logged, `pyfelix_datastore_parse_errors_total`, `on_error`, once per resourceVersion) and
handled as a delete of its key, and its list page or watch stream carries on.

Invariants: a key's updates are sent in the order the server sent them, each
resourceVersion of an object at most once (a replayed event with the resourceVersion
already sent is dropped); a delete is sent only for a key that was sent.

Easy to get wrong: list items come without apiVersion/kind (filled from the type); a
BOOKMARK carries only a resourceVersion; the resourceVersion to resume from after a relist
is the LIST's, not the newest object's.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from pyfelix.agent.inputs import InputError, check_document
from pyfelix.agent.kinds import ResourceType
from pyfelix.agent.syncer.api import (
    DatastoreError,
    RawUpdate,
    ResourceKey,
    SyncerCallbacks,
    SyncStatus,
    key_of,
)
from pyfelix.agent.syncer.backoff import Backoff
from pyfelix.agent.syncer.client import DatastoreClientError
from pyfelix.agent.syncer.kube_api import (
    KubeAPI,
    KubeError,
    KubeGone,
    KubeHTTPError,
    KubeNotFound,
    WatchStream,
)
from pyfelix.agent.syncer.kube_resources import resource_types as _resource_types
from pyfelix.agent.syncer.kube_resources import to_document
from pyfelix.agent.syncer.metrics import (
    DATASTORE_PARSE_ERRORS,
    DATASTORE_RESYNCS,
    RESYNC_ERROR,
    RESYNC_EXPIRED,
)

log = logging.getLogger(__name__)

BACKEND = "kubernetes"

KUBE_RELISTS = Counter(
    "pyfelix_kube_relists_total",
    "Number of times the Kubernetes syncer listed a resource type again because the API "
    "server answered 410 Gone (it no longer had the events since the resourceVersion the "
    "syncer was watching from); the first list at start is not counted.",
    ["resource"],
)
KUBE_WATCH_FAILURES = Counter(
    "pyfelix_kube_watch_failures_total",
    "Number of times a Kubernetes list or watch request failed (no connection, a broken "
    "stream, an error other than 410) and was retried after a backoff.",
    ["resource"],
)


@dataclass(frozen=True)
class _Report:
    """What a type watcher tells the syncer thread."""

    rtype: ResourceType
    what: str  # "listing", "updates", "synced", "resync", "error"
    updates: list[RawUpdate] = field(default_factory=list)
    error: DatastoreError | None = None


@dataclass
class WatchOptions:
    page_size: int = 500
    watch_timeout: int = 300  # timeoutSeconds asked of the server per watch request
    missing_type_retry: float = 30.0
    resync_settle: float = 0.2  # quiet time after a relist before IN_SYNC again
    backoff: Callable[[], Backoff] = Backoff


class _TypeWatcher:
    """List + watch of one resource type, in its own thread (see module docstring)."""

    def __init__(self, rtype: ResourceType, api: KubeAPI, reports: queue.Queue[_Report],
                 stop: threading.Event, options: WatchOptions) -> None:
        self.rtype = rtype
        self._api = api
        self._reports = reports
        self._stop = stop
        self._options = options
        self._backoff = options.backoff()
        self._sent: dict[ResourceKey, str] = {}  # key -> resourceVersion sent
        # key -> resourceVersion of an object rejected by the input limits (reported once)
        self._rejected: dict[ResourceKey, str] = {}
        self.resource_version = ""
        self._listed = False
        self._announced_empty = False
        self._stream: WatchStream | None = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"kube-watch-{rtype.plural}",
                                       daemon=True)

    def close_stream(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()

    # -- thread body --

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._listed:
                    self._list()
                self._watch()
            except KubeGone as exc:
                log.info("%s: %s; listing again", self.rtype, exc)
                KUBE_RELISTS.labels(resource=str(self.rtype)).inc()
                DATASTORE_RESYNCS.labels(backend=BACKEND, reason=RESYNC_EXPIRED).inc()
                self._listed = False
                self._report("resync")
            except KubeNotFound as exc:
                self._not_served(exc)
            except KubeError as exc:
                self._failed(exc)
            except Exception as exc:  # a bug: report it, relist after a backoff
                log.exception("%s: watcher failed unexpectedly", self.rtype)
                self._report("error", error=DatastoreError(
                    f"kubernetes:{self.rtype}", f"watcher failed unexpectedly ({exc!r}); "
                                                "listing again"))
                if self._listed:
                    DATASTORE_RESYNCS.labels(backend=BACKEND, reason=RESYNC_ERROR).inc()
                self._listed = False
                self._stop.wait(self._backoff.failed())

    def _not_served(self, exc: KubeNotFound) -> None:
        """The server does not serve this type (a CRD not installed, or removed): it holds
        nothing, which counts as listed; try again later."""
        gone = sorted(self._sent)
        self._emit([RawUpdate(key, None, self._source(key), "") for key in gone])
        self._sent.clear()
        self._listed = False
        if not self._announced_empty:
            self._announced_empty = True
            log.warning("%s is not served (%s); treated as empty, listing again every %.0f s",
                        self.rtype, exc, self._options.missing_type_retry)
            self._report("listing")
            self._report("synced")
        self._stop.wait(self._options.missing_type_retry)

    def _failed(self, exc: Exception) -> None:
        if self._stop.is_set():
            return
        KUBE_WATCH_FAILURES.labels(resource=str(self.rtype)).inc()
        delay = self._backoff.failed()
        log.warning("%s: %s; retrying in %.2f s", self.rtype, exc, delay)
        self._stop.wait(delay)

    def _report(self, what: str, updates: list[RawUpdate] | None = None,
                error: DatastoreError | None = None) -> None:
        self._reports.put(_Report(self.rtype, what, updates or [], error))

    # -- list --

    def _list(self) -> None:
        seen: set[ResourceKey] = set()
        continue_token = ""
        list_version = ""
        while True:
            try:
                page = self._api.list_page(self.rtype, limit=self._options.page_size,
                                           continue_token=continue_token)
            except KubeGone:
                if not continue_token:
                    raise
                log.info("%s: continue token expired; restarting the list", self.rtype)
                seen.clear()
                continue_token = list_version = ""
                continue
            metadata = page.get("metadata") or {}
            if not list_version:
                list_version = str(metadata.get("resourceVersion") or "")
                self._report("listing")
            updates: list[RawUpdate] = []
            for item in page.get("items") or []:
                key = self._put(item, updates)
                if key is not None:
                    seen.add(key)
            self._emit(updates)
            continue_token = str(metadata.get("continue") or "")
            if not continue_token:
                break
        gone = sorted(key for key in self._sent if key not in seen)
        self._emit([RawUpdate(key, None, self._source(key), list_version) for key in gone])
        for key in gone:
            del self._sent[key]
        self.resource_version = list_version
        self._listed = True
        self._backoff.succeeded()
        self._report("synced")

    # -- watch --

    def _watch(self) -> None:
        started = time.monotonic()
        stream = self._api.watch(self.rtype, self.resource_version,
                                 timeout_seconds=self._options.watch_timeout)
        with self._lock:
            if self._stop.is_set():
                stream.close()
                return
            self._stream = stream
        events = 0
        try:
            for event in stream:
                if self._stop.is_set():
                    return
                self._handle(event)
                events += 1
        finally:
            with self._lock:
                self._stream = None
            stream.close()
        if events == 0 and time.monotonic() - started < 1.0 and not self._stop.is_set():
            # A server that closes watches at once: do not spin.
            self._stop.wait(self._backoff.failed())
        else:
            self._backoff.succeeded()

    def _handle(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise KubeHTTPError(0, f"watch {self.rtype}: {kind} event without an object")
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            message = f"watch {self.rtype}: ERROR event: {obj.get('message', '')}"
            if code == 410:
                raise KubeGone(410, message)
            raise KubeHTTPError(code, message)
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        updates: list[RawUpdate] = []
        if kind in ("ADDED", "MODIFIED"):
            self._put(obj, updates)
        elif kind == "DELETED":
            self._delete(obj, version, updates)
        elif kind != "BOOKMARK":
            log.warning("%s: ignoring watch event of unknown type %r", self.rtype, kind)
        self._emit(updates)
        if version:
            self.resource_version = version

    # -- objects to updates --

    def _source(self, key: ResourceKey) -> str:
        return f"kubernetes:{self.rtype.object_path(key.namespace, key.name)}"

    def _key_of(self, obj: dict[str, Any]) -> ResourceKey | None:
        """The key of an API object, from its metadata alone (a hostile spec is not even
        copied); None, reported, when it cannot be keyed."""
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        try:
            return key_of(to_document(self.rtype, {"metadata": meta}))
        except ValueError as exc:
            namespace = meta.get("namespace")
            where = "kubernetes:" + self.rtype.collection_path(
                namespace if isinstance(namespace, str) else None)
            self._parse_error(DatastoreError(where, f"cannot be keyed: {exc}; skipped"))
            return None

    def _parse_error(self, error: DatastoreError) -> None:
        DATASTORE_PARSE_ERRORS.labels(backend=BACKEND).inc()
        log.warning("kubernetes datastore: %s", error)
        self._report("error", error=error)

    def _put(self, obj: dict[str, Any], updates: list[RawUpdate]) -> ResourceKey | None:
        key = self._key_of(obj)
        if key is None:
            return None
        version = _version_of(obj)
        try:
            check_document(obj, resource=str(key))
        except InputError as exc:
            # Rejected (agent.inputs limits): like an invalid document, a delete of what was
            # sent for the key; reported once per resourceVersion.
            if not version or self._rejected.get(key) != version:
                self._parse_error(DatastoreError(self._source(key),
                                                 f"{exc}; handled as a delete"))
            self._rejected[key] = version
            self._drop(key, version, updates)
            return key
        self._rejected.pop(key, None)
        if self._sent.get(key) != version or not version:
            self._sent[key] = version
            updates.append(RawUpdate(key, to_document(self.rtype, obj), self._source(key),
                                     version))
        return key

    def _delete(self, obj: dict[str, Any], version: str, updates: list[RawUpdate]) -> None:
        key = self._key_of(obj)
        if key is not None:
            self._rejected.pop(key, None)
            self._drop(key, version, updates)

    def _drop(self, key: ResourceKey, version: str, updates: list[RawUpdate]) -> None:
        if self._sent.pop(key, None) is not None:
            updates.append(RawUpdate(key, None, self._source(key), version))

    def _emit(self, updates: list[RawUpdate]) -> None:
        if updates:
            self._report("updates", updates)


def _version_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return str(version) if isinstance(version, str | int) else ""


class KubeSyncer:
    """Lists and watches the Kubernetes API (see module docstring)."""

    def __init__(self, api: KubeAPI, *,
                 resource_types: Sequence[ResourceType] | None = None,
                 options: WatchOptions | None = None) -> None:
        self.api = api
        # default: the agent's types (no Secrets; confd passes resource_types("bgp"))
        self._types = tuple(resource_types if resource_types is not None
                            else _resource_types("felix"))
        self._options = options or WatchOptions()
        self._stop = threading.Event()
        self._reports: queue.Queue[_Report] = queue.Queue()
        self._watchers = [_TypeWatcher(rtype, api, self._reports, self._stop, self._options)
                          for rtype in self._types]
        self._thread: threading.Thread | None = None
        self._status: SyncStatus | None = None

    def start(self, callbacks: SyncerCallbacks) -> None:
        if self._thread is not None:
            raise RuntimeError("KubeSyncer already started")
        self._thread = threading.Thread(target=self._run, args=(callbacks,),
                                        name="kube-syncer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        for watcher in self._watchers:
            watcher.close_stream()
        deadline = time.monotonic() + self.api.request_timeout + 5.0
        for watcher in self._watchers:
            if watcher.thread.is_alive():
                watcher.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def resource_version(self, rtype: ResourceType) -> str:
        """The resourceVersion a type's watch resumes from (for tests and debug)."""
        return next(w.resource_version for w in self._watchers if w.rtype == rtype)

    def _set_status(self, callbacks: SyncerCallbacks, status: SyncStatus) -> None:
        if status is not self._status:
            self._status = status
            callbacks.on_status(status)

    def _run(self, callbacks: SyncerCallbacks) -> None:
        self._set_status(callbacks, SyncStatus.WAIT_FOR_DATASTORE)
        for watcher in self._watchers:
            watcher.thread.start()
        unsynced = set(self._types)
        synced_once = False
        settled_at: float | None = None  # when a resync may be declared over
        while not self._stop.is_set():
            try:
                report = self._reports.get(timeout=0.05)
            except queue.Empty:
                report = None
            if report is not None:
                self._dispatch(callbacks, report, unsynced)
            if unsynced or self._status is not SyncStatus.RESYNC:
                settled_at = None
                continue
            if not synced_once:  # the first sync needs no settling
                synced_once = True
                self._set_status(callbacks, SyncStatus.IN_SYNC)
            elif settled_at is None:
                # After a relist, wait a moment: the other types' watches usually broke in
                # the same outage and relist too; one RESYNC -> IN_SYNC for all of them.
                settled_at = time.monotonic() + self._options.resync_settle
            elif time.monotonic() >= settled_at:
                self._set_status(callbacks, SyncStatus.IN_SYNC)

    def _dispatch(self, callbacks: SyncerCallbacks, report: _Report,
                  unsynced: set[ResourceType]) -> None:
        if report.what == "updates":
            callbacks.on_updates(report.updates)
        elif report.what == "error" and report.error is not None:
            callbacks.on_error(report.error)
        elif report.what == "listing":
            if self._status is SyncStatus.WAIT_FOR_DATASTORE:  # the server answers
                self._set_status(callbacks, SyncStatus.RESYNC)
        elif report.what == "resync":
            unsynced.add(report.rtype)
            self._set_status(callbacks, SyncStatus.RESYNC)
        elif report.what == "synced":
            unsynced.discard(report.rtype)


def make_kube_syncer(*, kubeconfig: str | None = None, context: str | None = None,
                     request_timeout: float = 10.0, syncer_type: str = "felix",
                     **options: Any) -> KubeSyncer:
    """The syncer for `--datastore kubernetes`: credentials from `kubeconfig`, $KUBECONFIG,
    the in-cluster service account, or ~/.kube/config (in that order); `options` go to
    WatchOptions. Raises DatastoreClientError if no credentials can be loaded."""
    try:
        api = KubeAPI.from_environment(kubeconfig, context, request_timeout=request_timeout)
    except KubeError as exc:
        raise DatastoreClientError(str(exc)) from exc
    return KubeSyncer(api, resource_types=_resource_types(syncer_type),
                      options=WatchOptions(**options))
