"""The file datastore: a directory tree (or one file) of YAML/JSON resources, watched for edits.

Role: the embedded default backend. `FileSyncer` implements `agent.syncer.api.Syncer`;
`load_path()` is its synchronous one-shot twin (used by `pyfelix calc`, the CLI and tests).

Inputs:
- a directory, read recursively: files named `*.yaml`, `*.yml`, `*.json`. Hidden entries
  (`.name`, including whole hidden directories such as `.git`) and editor temporaries
  (`name~`, `#name#`) are ignored. Symlinked files are followed (Kubernetes ConfigMap mounts
  are symlinks); symlinked directories are not descended into;
- or a single file, whatever its name.
A YAML file may hold several documents (`---`); a document may be a list (`kind: List` or
`kind: <Kind>List` with `items:`, as kubectl and calicoctl print them; an item without
`kind` takes it from `<Kind>List`). A JSON file holds one or more concatenated JSON values.

Outputs: `RawUpdate`s keyed by `key_of(doc)`, each with `source` = `"<path>#<n>"` (n counts
the file's documents from 1) or `"<path>#<n>.items[<i>]"` (i counts from 0); status
WAIT_FOR_DATASTORE (path missing) -> RESYNC -> IN_SYNC; `DatastoreError`s.

Invariants (what the rest of the pipeline relies on):
- A file that fails to parse (YAML/JSON syntax, unreadable, not UTF-8) keeps its last good
  contents: no deletes are sent for it, and exactly one error names the file and the failing
  document and line. Fixing the file later applies the difference.
- A document that cannot be keyed (no kind / metadata.name), or that `agent.inputs` rejects
  (input limits: size, depth, aliases, members, duplicate keys...), is reported (file,
  document, line, and for a rejection resource, field and limit) and skipped; the rest of
  its file loads. If it used to define a key, that key is deleted (nothing names it any
  more). Decoding is `agent.inputs`' (`decode_yaml_documents`, `decode_json_documents`).
- The same key defined twice: the definition last in sorted path order wins (paths compared
  component by component, then document order within a file), and one DatastoreError names
  every definition. It is reported again only when the set of definitions changes.
- Only differences are sent: an unchanged document sends nothing; a document moved to
  another file (rename, cut+paste seen in one debounced batch) sends nothing; a removed one
  sends a delete (value None).
- Watching uses inotify (ctypes, `agent.syncer.inotify`), with watches added BEFORE the
  initial scan so no edit between scan and watch is lost, and a polling fallback (stat
  signature: inode, size, mtime, ctime) when inotify is unavailable or out of watches.
  Bursts are debounced because editors save in several steps, for at most 1 s
  (`settle_limit`); how long the quiet must last depends on what the burst shows (inotify):
    - every resource file it touched was last seen renamed into place (IN_MOVED_TO), i.e.
      atomic writes such as those of `pyfelix apply` and the lab: `settle` (default 10 ms)
      of quiet, so several files renamed back to back still land in one batch;
    - anything else: `debounce` (default 50 ms) of quiet. That includes a file written in
      place even once it is closed (IN_CLOSE_WRITE only says one descriptor closed: `echo
      a > f; echo b >> f` closes twice, and a YAML file cut at a line boundary may parse,
      e.g. as an Allow rule whose source has not been written yet), a delete or move out
      that may be half of a replace, directory changes, Kubernetes' `..data` swap, an
      overflow. Polling always uses `debounce`.
  A slow periodic rescan backs inotify up.

Easy to get wrong: inotify watches are per directory (new subdirectories need new watches
and a rescan); a directory moved out of the tree keeps reporting under its old path unless
its watches are removed; Kubernetes' atomic writer swaps a hidden `..data` symlink, so
events on `..`-names trigger a rescan of their directory by signature.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from pyfelix.agent.inputs import (
    Document,
    InputError,
    InputSyntaxError,
    decode_json_documents,
    decode_yaml_documents,
)
from pyfelix.agent.syncer.api import (
    DatastoreError,
    RawUpdate,
    ResourceKey,
    SyncerCallbacks,
    SyncStatus,
    key_of,
)
from pyfelix.agent.syncer.inotify import (
    IN_ATTRIB,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Inotify,
    InotifyEvent,
    InotifyUnavailable,
)
from pyfelix.agent.syncer.metrics import DATASTORE_PARSE_ERRORS

log = logging.getLogger(__name__)

BACKEND = "file"
RESOURCE_SUFFIXES = (".yaml", ".yml", ".json")
JSON_SUFFIX = ".json"
DEFAULT_SETTLE = 0.01  # seconds of quiet after complete writes (module docstring)

# --------------------------------------------------------------------------------------------
# Parsing one file


@dataclass(frozen=True)
class ParsedDoc:
    """One keyed resource document and where it came from."""

    key: ResourceKey
    value: dict[str, Any]
    source: str  # "<path>#<doc>" or "<path>#<doc>.items[<i>]"
    doc_index: int  # 1-based document number in its file
    item_index: int | None  # 0-based position inside a List document, else None
    line: int | None  # 1-based line where the document (or list item) starts

    @property
    def position(self) -> tuple[int, int]:
        return (self.doc_index, -1 if self.item_index is None else self.item_index)


@dataclass(frozen=True)
class ParsedFile:
    """The result of parsing one file: its keyed documents and its errors.

    `failed` means the file as a whole could not be used (syntax error, unreadable): the
    syncer then keeps the file's last good documents.
    """

    path: str
    docs: tuple[ParsedDoc, ...]
    errors: tuple[DatastoreError, ...]
    failed: bool
    document_count: int


def _where(doc_index: int, line: int | None, column: int | None = None) -> str:
    if line is None:
        return f"document {doc_index}"
    if column is None:
        return f"document {doc_index} (line {line})"
    return f"document {doc_index} (line {line}, column {column})"


class _DocCollector:
    """Turns decoded documents of one file into ParsedDocs and errors."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.docs: list[ParsedDoc] = []
        self.errors: list[DatastoreError] = []

    def add(self, doc_index: int, value: Any, line: int | None,
            item_lines: list[int] | None = None) -> None:
        if value is None:
            return  # an empty document (a trailing `---`): nothing to load
        items = value.get("items") if isinstance(value, dict) else None
        kind = value.get("kind") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
            self._add_list(doc_index, kind, value, items, line, item_lines)
            return
        source = f"{self.path}#{doc_index}"
        try:
            key = key_of(value)
        except ValueError as exc:
            self.errors.append(DatastoreError(
                source, f"{_where(doc_index, line)}: cannot be keyed: {exc}; skipped"))
            return
        self.docs.append(ParsedDoc(key, value, source, doc_index, None, line))

    def _add_list(self, doc_index: int, list_kind: str, value: dict[str, Any],
                  items: list[Any], line: int | None, item_lines: list[int] | None) -> None:
        item_kind = list_kind[: -len("List")]
        for i, item in enumerate(items):
            item_line = item_lines[i] if item_lines and i < len(item_lines) else line
            source = f"{self.path}#{doc_index}.items[{i}]"
            if isinstance(item, dict) and "kind" not in item and item_kind:
                item = {"apiVersion": value.get("apiVersion"), "kind": item_kind, **item}
            try:
                key = key_of(item)
            except ValueError as exc:
                where = f"{_where(doc_index, None)}, items[{i}]"
                if item_line is not None:
                    where += f" (line {item_line})"
                self.errors.append(
                    DatastoreError(source, f"{where}: cannot be keyed: {exc}; skipped"))
                continue
            self.docs.append(ParsedDoc(key, item, source, doc_index, i, item_line))

    def reject(self, doc_index: int, line: int | None, error: InputError) -> None:
        """A document that broke an input limit (agent.inputs): reported and skipped."""
        self.errors.append(DatastoreError(f"{self.path}#{doc_index}",
                                          f"{_where(doc_index, line)}: {error}; skipped"))

    def result(self, document_count: int) -> ParsedFile:
        return ParsedFile(self.path, tuple(self.docs), tuple(self.errors), False, document_count)

    def failure(self, doc_index: int, message: str) -> ParsedFile:
        error = DatastoreError(f"{self.path}#{doc_index}", message)
        return ParsedFile(self.path, (), (error,), True, 0)


def _collect(path: str, documents: Iterator[Document], language: str) -> ParsedFile:
    """Feed decoded documents to a collector; a syntax error fails the whole file."""
    collector = _DocCollector(path)
    count = 0
    try:
        for document in documents:
            count = document.index
            if document.error is not None:
                collector.reject(document.index, document.line, document.error)
            else:
                collector.add(document.index, document.value, document.line,
                              list(document.item_lines) if document.item_lines else None)
    except InputSyntaxError as exc:
        where = _where(exc.index, exc.line, exc.column)
        return collector.failure(exc.index, f"{where}: invalid {language}: {exc.detail}; the "
                                            "file's last good contents (if any) stay in effect")
    return collector.result(count)


def parse_yaml(path: str, text: str) -> ParsedFile:
    """Parse a (multi-document) YAML text; `path` only labels sources and errors."""
    return _collect(path, decode_yaml_documents(text), "YAML")


def parse_json(path: str, text: str) -> ParsedFile:
    """Parse one or more concatenated JSON values; `path` only labels sources and errors."""
    return _collect(path, decode_json_documents(text), "JSON")


def parse_text(path: str, text: str) -> ParsedFile:
    """Parse a file's text: JSON when the name ends in .json, YAML otherwise."""
    if path.endswith(JSON_SUFFIX):
        return parse_json(path, text)
    return parse_yaml(path, text)


def _unreadable(path: str, message: str) -> ParsedFile:
    return ParsedFile(path, (), (DatastoreError(path, message),), True, 0)


# --------------------------------------------------------------------------------------------
# Which files make up the datastore, and which changed


def is_resource_file_name(name: str) -> bool:
    """A file name the directory datastore reads (not hidden, not an editor temporary)."""
    if not name or name[0] in ".#~" or name.endswith(("~", "#")):
        return False
    return name.endswith(RESOURCE_SUFFIXES)


def is_hidden_name(name: str) -> bool:
    return name.startswith(".")


def path_order(path: str) -> tuple[str, ...]:
    """Sort key for "last definition wins": path components compared one by one."""
    return PurePath(path).parts


def _is_under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


Signature = tuple[int, int, int, int]


def _signature(st: os.stat_result) -> Signature:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class _FileRecord:
    signature: Signature
    digest: bytes | None  # None when the file could not be read: retried on any change


class DatastoreTree:
    """The set of files of one file datastore and what was last read from each.

    `scan()` walks part of the tree, re-reads files whose stat signature (or, when forced,
    whose bytes) changed, parses them, and returns only the files that changed: a
    `ParsedFile`, or None for a file that is gone.
    """

    def __init__(self, root: str, *, single_file: bool) -> None:
        self.root = os.path.normpath(root)
        self.single_file = single_file
        self._records: dict[str, _FileRecord] = {}

    @property
    def watch_root(self) -> str:
        """The directory whose entries decide the datastore's contents."""
        if self.single_file:
            return os.path.dirname(self.root) or "."
        return self.root

    def walk(self, top: str) -> list[str]:
        """Datastore files under `top` (a directory, a file, or a path that no longer exists)."""
        if self.single_file:
            return [self.root] if _is_under(self.root, top) and os.path.isfile(self.root) else []
        if not _is_under(top, self.root):
            return []
        if os.path.isdir(top):
            found: list[str] = []
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames[:] = sorted(d for d in dirnames if not is_hidden_name(d))
                for name in sorted(filenames):
                    if is_resource_file_name(name):
                        path = os.path.join(dirpath, name)
                        if os.path.isfile(path):
                            found.append(path)
            return found
        if os.path.isfile(top) and is_resource_file_name(os.path.basename(top)):
            relative = os.path.relpath(top, self.root)
            if not any(is_hidden_name(part) for part in PurePath(relative).parts):
                return [top]
        return []

    def pending_changes(self) -> dict[str, Signature | None]:
        """Files whose signature differs from the last scan (None: gone); reads nothing."""
        current: dict[str, Signature | None] = {}
        for path in self.walk(self.root):
            try:
                current[path] = _signature(os.stat(path))
            except OSError:
                continue
        changes: dict[str, Signature | None] = {
            path: sig for path, sig in current.items()
            if path not in self._records or self._records[path].signature != sig
        }
        for path in self._records:
            if path not in current:
                changes[path] = None
        return changes

    def scan(self, tops: Mapping[str, bool]) -> dict[str, ParsedFile | None]:
        """Rescan each `top` (value: force a re-read even if the signature is unchanged)."""
        changed: dict[str, ParsedFile | None] = {}
        for top, force in sorted(tops.items()):
            present = self.walk(top)
            present_set = set(present)
            for path in [p for p in self._records if _is_under(p, top) and p not in present_set]:
                del self._records[path]
                changed[path] = None
            for path in present:
                did_change, parsed = self._rescan_file(path, force)
                if did_change:
                    changed[path] = parsed
        return changed

    def _rescan_file(self, path: str, force: bool) -> tuple[bool, ParsedFile | None]:
        """(whether the file changed, its new parse or None if it is gone)."""
        try:
            sig = _signature(os.stat(path))
        except OSError:
            return self._records.pop(path, None) is not None, None
        record = self._records.get(path)
        if record is not None and not force and record.signature == sig:
            return False, None
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return self._records.pop(path, None) is not None, None
        except OSError as exc:
            self._records[path] = _FileRecord(sig, None)
            return True, _unreadable(path, f"cannot read the file: {exc.strerror or exc}; its "
                                           "last good contents (if any) stay in effect")
        digest = hashlib.sha256(data).digest()
        if record is not None and record.digest == digest:
            record.signature = sig
            return False, None
        self._records[path] = _FileRecord(sig, digest)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return True, _unreadable(path, f"the file is not UTF-8 text (byte {exc.start}); its "
                                           "last good contents (if any) stay in effect")
        return True, parse_text(path, text)


# --------------------------------------------------------------------------------------------
# Merging files into one keyed view


class ResourceIndex:
    """Merges the documents of every file into one value per key and diffs it with what
    was already emitted.

    Per key the winning definition is the last one in (path_order(path), document order).
    `apply()` takes replaced files and returns the RawUpdates to send plus duplicate-key
    warnings.
    """

    def __init__(self) -> None:
        self._files: dict[str, dict[ResourceKey, list[ParsedDoc]]] = {}
        self._definers: dict[ResourceKey, set[str]] = {}
        self._sent: dict[ResourceKey, ParsedDoc] = {}
        self._reported_duplicates: dict[ResourceKey, tuple[str, ...]] = {}

    def current(self) -> dict[ResourceKey, ParsedDoc]:
        """The winning definition of every key (what has been emitted)."""
        return dict(self._sent)

    def files(self) -> list[str]:
        return list(self._files)

    def apply(
        self, changes: Mapping[str, Iterable[ParsedDoc] | None]
    ) -> tuple[list[RawUpdate], list[DatastoreError]]:
        affected: set[ResourceKey] = set()
        for path, docs in changes.items():
            for key in self._files.pop(path, {}):
                affected.add(key)
                self._definers[key].discard(path)
            if docs is None:
                continue
            by_key: dict[ResourceKey, list[ParsedDoc]] = {}
            for doc in docs:
                by_key.setdefault(doc.key, []).append(doc)
            self._files[path] = by_key
            for key in by_key:
                affected.add(key)
                self._definers.setdefault(key, set()).add(path)
        updates: list[RawUpdate] = []
        warnings: list[DatastoreError] = []
        for key in sorted(affected):
            definitions = self._definitions(key)
            self._track_duplicates(key, definitions, warnings)
            previous = self._sent.get(key)
            if not definitions:
                self._definers.pop(key, None)
                if previous is not None:
                    del self._sent[key]
                    updates.append(RawUpdate(key, None, previous.source))
                continue
            winner = definitions[-1]
            self._sent[key] = winner
            if previous is None or previous.value != winner.value:
                updates.append(RawUpdate(key, winner.value, winner.source))
        return updates, warnings

    def _definitions(self, key: ResourceKey) -> list[ParsedDoc]:
        found = [
            doc for path in self._definers.get(key, ()) for doc in self._files[path][key]
        ]
        found.sort(key=lambda d: (path_order(d.source.rsplit("#", 1)[0]), d.position))
        return found

    def _track_duplicates(self, key: ResourceKey, definitions: list[ParsedDoc],
                          warnings: list[DatastoreError]) -> None:
        if len(definitions) < 2:
            self._reported_duplicates.pop(key, None)
            return
        sources = tuple(d.source for d in definitions)
        if self._reported_duplicates.get(key) == sources:
            return
        self._reported_duplicates[key] = sources
        winner = sources[-1]
        others = ", ".join(sources[:-1])
        warnings.append(DatastoreError(
            winner, f"{key} is defined more than once (also at {others}); using {winner}, the "
                    "last definition in sorted path order"))


# --------------------------------------------------------------------------------------------
# One-shot loading


def load_files(path: str) -> list[ParsedFile]:
    """Parse every file of a datastore path (directory or file), in sorted path order.

    Raises FileNotFoundError if the path does not exist.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "datastore path does not exist", path)
    tree = DatastoreTree(path, single_file=not os.path.isdir(path))
    parsed = tree.scan({tree.root: True})
    return [parsed[p] for p in sorted(parsed, key=path_order) if parsed[p] is not None]


def _merge(files: Iterable[ParsedFile]) -> tuple[list[RawUpdate], list[DatastoreError]]:
    errors: list[DatastoreError] = []
    changes: dict[str, tuple[ParsedDoc, ...]] = {}
    for parsed in files:
        errors.extend(parsed.errors)
        if not parsed.failed:
            changes[parsed.path] = parsed.docs
    updates, duplicates = ResourceIndex().apply(changes)
    return updates, errors + duplicates


def load_text(label: str, text: str) -> tuple[list[RawUpdate], list[DatastoreError]]:
    """Like load_path for text read elsewhere (stdin); `label` names it in sources."""
    return _merge([parse_text(label, text)])


def load_path(path: str) -> tuple[list[RawUpdate], list[DatastoreError]]:
    """Read a datastore path once: the current resources (sorted by key) and every error.

    Raises FileNotFoundError if the path does not exist. Errors are per file and document
    (parse errors, unkeyable documents, duplicate keys); they never stop the good documents.
    """
    return _merge(load_files(path))


# --------------------------------------------------------------------------------------------
# Watching


Changes = dict[str, bool]  # path to rescan -> force a re-read even if the stat is unchanged


class WriteTracker:
    """Whether an inotify burst so far consists of atomic writes only (module docstring).

    Fed events in arrival order; `complete` is true when at least one resource file was
    touched, each one's last content event was IN_MOVED_TO (renamed into place), and
    nothing else happened that may be the first half of a change (directories, `..` names,
    in-place writes even when closed, deletes or moves out as a file's last event,
    overflow, the watched directory itself changing). IN_ATTRIB (chmod, touch) says
    nothing about content and leaves a file as it was.
    """

    _FINISHED = IN_MOVED_TO
    _UNSETTLING = IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF

    def __init__(self, is_resource: Callable[[InotifyEvent], bool]) -> None:
        self._is_resource = is_resource
        self._unfinished: set[tuple[int, str]] = set()
        self._touched = False
        self._unsettled = False

    def add(self, events: Iterable[InotifyEvent]) -> None:
        for event in events:
            if event.mask & self._UNSETTLING or event.is_dir or event.name.startswith(".."):
                self._unsettled = True
                continue
            if not event.name or not self._is_resource(event):
                continue
            key = (event.wd, event.name)
            self._touched = True
            if event.mask & self._FINISHED:
                self._unfinished.discard(key)
            elif not event.mask & IN_ATTRIB:
                self._unfinished.add(key)

    @property
    def complete(self) -> bool:
        return self._touched and not self._unsettled and not self._unfinished


class _PollingWatcher:
    """Finds changes by stat-ing every file each `interval` seconds."""

    mode = "poll"

    def __init__(self, tree: DatastoreTree, stop: threading.Event, *, interval: float,
                 debounce: float, settle_limit: float, clock: Callable[[], float]) -> None:
        self._tree = tree
        self._stop = stop
        self._interval = interval
        self._debounce = debounce
        self._settle_limit = settle_limit
        self._clock = clock

    def wait_for_changes(self) -> Changes:
        if self._stop.wait(self._interval):
            return {}
        pending = self._tree.pending_changes()
        if not pending:
            return {}
        deadline = self._clock() + self._settle_limit
        while self._clock() < deadline:  # wait until the files stop changing (editor saves)
            if self._stop.wait(self._debounce):
                return {}
            again = self._tree.pending_changes()
            if again == pending:
                break
            pending = again
        return {self._tree.root: False}

    def close(self) -> None:
        pass


class _InotifyWatcher:
    """Finds changes from inotify events on every directory of the tree."""

    mode = "inotify"

    def __init__(self, tree: DatastoreTree, stop: threading.Event, wake_fd: int, *,
                 debounce: float, settle: float, settle_limit: float, poll_interval: float,
                 rescan_interval: float, clock: Callable[[], float]) -> None:
        self._tree = tree
        self._stop = stop
        self._wake_fd = wake_fd
        self._debounce = debounce
        self._settle = settle
        self._settle_limit = settle_limit
        self._poll_interval = poll_interval
        self._rescan_interval = rescan_interval
        self._clock = clock
        self._inotify = Inotify()
        self._dir_of_wd: dict[int, str] = {}
        self._wd_of_dir: dict[str, int] = {}
        self._next_rescan = clock() + rescan_interval
        try:
            self._watch_root()
        except BaseException:
            self._inotify.close()
            raise

    @property
    def root_watched(self) -> bool:
        return self._tree.watch_root in self._wd_of_dir

    def _watch_root(self) -> None:
        if self._tree.single_file:
            self._add_watch(self._tree.watch_root)
        else:
            self._watch_tree(self._tree.root)

    def _add_watch(self, directory: str) -> None:
        try:
            wd = self._inotify.add_watch(directory)
        except InotifyUnavailable:
            raise
        except OSError:
            return  # vanished or not a directory: a later event or rescan covers it
        self._dir_of_wd[wd] = directory
        self._wd_of_dir[directory] = wd

    def _watch_tree(self, top: str) -> None:
        if not os.path.isdir(top):
            return
        self._add_watch(top)
        for dirpath, dirnames, _ in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if not is_hidden_name(d))
            for name in dirnames:
                self._add_watch(os.path.join(dirpath, name))

    def _forget_tree(self, top: str) -> None:
        for directory in [d for d in self._wd_of_dir if _is_under(d, top)]:
            wd = self._wd_of_dir.pop(directory)
            self._dir_of_wd.pop(wd, None)
            self._inotify.rm_watch(wd)

    def wait_for_changes(self) -> Changes:
        if self._stop.is_set():
            return {}
        if not self.root_watched:
            timeout = self._poll_interval
        else:
            timeout = max(0.0, self._next_rescan - self._clock())
        readable, _, _ = select.select([self._inotify.fileno(), self._wake_fd], [], [], timeout)
        if self._stop.is_set():
            return {}
        if not readable:
            return self._on_timeout()
        events = self._inotify.read_events()
        tracker = WriteTracker(self._is_resource_event)
        tracker.add(events)
        deadline = self._clock() + self._settle_limit
        while True:  # keep collecting until quiet for `settle` or `debounce` seconds
            quiet = self._settle if tracker.complete else self._debounce
            remaining = min(quiet, deadline - self._clock())
            if remaining <= 0:
                break
            readable, _, _ = select.select([self._inotify.fileno(), self._wake_fd], [], [],
                                           remaining)
            if not readable or self._stop.is_set():
                break
            more = self._inotify.read_events()
            tracker.add(more)
            events.extend(more)
        return self._interpret(events)

    def _is_resource_event(self, event: InotifyEvent) -> bool:
        if self._tree.single_file:
            return os.path.join(self._dir_of_wd.get(event.wd, ""), event.name) == self._tree.root
        return not is_hidden_name(event.name) and is_resource_file_name(event.name)

    def _on_timeout(self) -> Changes:
        self._next_rescan = self._clock() + self._rescan_interval
        if not self.root_watched:
            self._watch_root()
        return {self._tree.root: False}

    def _interpret(self, events: list[InotifyEvent]) -> Changes:
        changes: Changes = {}
        tree = self._tree

        def mark(path: str, force: bool) -> None:
            changes[path] = changes.get(path, False) or force

        for event in events:
            if event.mask & IN_Q_OVERFLOW:
                log.warning("inotify queue overflowed; rescanning %s", tree.root)
                self._forget_tree(tree.watch_root)
                self._watch_root()
                mark(tree.root, False)
                continue
            directory = self._dir_of_wd.get(event.wd)
            if directory is None:
                continue
            if event.mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                if directory == tree.watch_root:  # the datastore itself vanished or moved
                    self._forget_tree(tree.watch_root)
                    mark(tree.root, False)
                elif event.mask & IN_IGNORED:
                    self._wd_of_dir.pop(directory, None)
                    self._dir_of_wd.pop(event.wd, None)
                continue
            if not event.name:
                continue
            path = os.path.join(directory, event.name)
            if tree.single_file:
                if path == tree.root or event.name.startswith(".."):
                    mark(tree.root, path == tree.root)
                continue
            if event.name.startswith(".."):  # Kubernetes atomic writer swapped `..data`
                mark(directory, False)
                continue
            if is_hidden_name(event.name):
                continue
            if event.is_dir:
                if event.mask & (IN_MOVED_FROM | IN_DELETE):
                    self._forget_tree(path)
                if event.mask & (IN_CREATE | IN_MOVED_TO):
                    self._watch_tree(path)
                mark(path, False)
            elif is_resource_file_name(event.name):
                mark(path, True)
        return changes

    def close(self) -> None:
        self._inotify.close()


# --------------------------------------------------------------------------------------------
# The syncer


class FileSyncer:
    """Syncer for the file datastore (see the module docstring for the contract).

    `use_inotify=False` forces polling; `poll_interval` is the polling period and, with
    inotify, how often a missing datastore path is looked for; `rescan_interval` is the
    inotify safety-net rescan period.
    """

    def __init__(self, path: str | os.PathLike[str], *, poll_interval: float = 1.0,
                 debounce: float = 0.05, settle: float | None = None,
                 settle_limit: float = 1.0, use_inotify: bool = True,
                 rescan_interval: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if settle is None:
            settle = min(DEFAULT_SETTLE, debounce)
        elif not 0 <= settle <= debounce:
            raise ValueError(f"FileSyncer: settle {settle!r} must be within 0..debounce "
                             f"({debounce!r})")
        self.path = os.fspath(path)
        self._poll_interval = poll_interval
        self._debounce = debounce
        self._settle = settle
        self._settle_limit = settle_limit
        self._use_inotify = use_inotify
        self._rescan_interval = rescan_interval
        self._clock = clock
        self._stop = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        self._thread: threading.Thread | None = None
        self._callbacks: SyncerCallbacks | None = None
        self._index = ResourceIndex()
        self._watcher: _PollingWatcher | _InotifyWatcher | None = None
        self.mode = ""  # "inotify" or "poll" once watching

    def start(self, callbacks: SyncerCallbacks) -> None:
        if self._thread is not None:
            raise RuntimeError("FileSyncer already started")
        self._callbacks = callbacks
        self._thread = threading.Thread(target=self._run, name=f"file-syncer:{self.path}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._wake_write >= 0:
            try:
                os.write(self._wake_write, b"x")
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        for fd in (self._wake_read, self._wake_write):
            if fd >= 0:
                os.close(fd)
        self._wake_read = self._wake_write = -1

    # -- thread body --

    def _run(self) -> None:
        assert self._callbacks is not None
        callbacks = self._callbacks
        callbacks.on_status(SyncStatus.WAIT_FOR_DATASTORE)
        while not os.path.exists(self.path):
            if self._stop.wait(self._poll_interval):
                return
        single_file = not os.path.isdir(self.path)  # fixed for the syncer's life
        first = True
        while not self._stop.is_set():
            try:
                self._sync_and_watch(callbacks, DatastoreTree(self.path, single_file=single_file),
                                     first)
                return
            except Exception as exc:  # a bug or an unexpected OS error: report, restart
                log.exception("file syncer for %s failed", self.path)
                callbacks.on_error(DatastoreError(
                    self.path, f"file syncer failed unexpectedly ({exc!r}); rescanning in "
                               f"{self._poll_interval} s"))
                first = False
                if self._stop.wait(self._poll_interval):
                    return
            finally:
                if self._watcher is not None:
                    self._watcher.close()
                    self._watcher = None

    def _sync_and_watch(self, callbacks: SyncerCallbacks, tree: DatastoreTree,
                        first: bool) -> None:
        """Watch first, then list everything, then apply changes until stopped."""
        self._watcher = self._make_watcher(tree)
        if first:
            callbacks.on_status(SyncStatus.RESYNC)
        full: dict[str, ParsedFile | None] = {path: None for path in self._index.files()}
        full.update(tree.scan({tree.root: True}))
        self._process(callbacks, full)
        if first:
            callbacks.on_status(SyncStatus.IN_SYNC)
        while not self._stop.is_set():
            try:
                changes = self._watcher.wait_for_changes()
            except InotifyUnavailable as exc:
                log.warning("inotify failed (%s); polling %s instead", exc, self.path)
                self._switch_to_polling(tree)
                changes = {tree.root: False}
            if changes and not self._stop.is_set():
                self._process(callbacks, tree.scan(changes))

    def _make_watcher(self, tree: DatastoreTree) -> _PollingWatcher | _InotifyWatcher:
        if self._use_inotify:
            try:
                watcher = _InotifyWatcher(
                    tree, self._stop, self._wake_read, debounce=self._debounce,
                    settle=self._settle, settle_limit=self._settle_limit,
                    poll_interval=self._poll_interval,
                    rescan_interval=self._rescan_interval, clock=self._clock)
                self.mode = watcher.mode
                return watcher
            except InotifyUnavailable as exc:
                log.warning("inotify unavailable (%s); polling %s every %.1f s", exc,
                            self.path, self._poll_interval)
        return self._polling_watcher(tree)

    def _polling_watcher(self, tree: DatastoreTree) -> _PollingWatcher:
        watcher = _PollingWatcher(tree, self._stop, interval=self._poll_interval,
                                  debounce=self._debounce, settle_limit=self._settle_limit,
                                  clock=self._clock)
        self.mode = watcher.mode
        return watcher

    def _switch_to_polling(self, tree: DatastoreTree) -> None:
        if self._watcher is not None:
            self._watcher.close()
        self._watcher = self._polling_watcher(tree)

    def _process(self, callbacks: SyncerCallbacks,
                 changed: Mapping[str, ParsedFile | None]) -> None:
        errors: list[DatastoreError] = []
        index_changes: dict[str, tuple[ParsedDoc, ...] | None] = {}
        for path in sorted(changed, key=path_order):
            parsed = changed[path]
            if parsed is None:
                index_changes[path] = None
                continue
            errors.extend(parsed.errors)
            if parsed.errors:
                DATASTORE_PARSE_ERRORS.labels(backend=BACKEND).inc(len(parsed.errors))
            if not parsed.failed:
                index_changes[path] = parsed.docs
        updates, duplicates = self._index.apply(index_changes)
        for error in errors + duplicates:
            log.warning("datastore: %s", error)
            callbacks.on_error(error)
        if updates:
            callbacks.on_updates(updates)
