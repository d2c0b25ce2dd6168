"""Writes to the file datastore: the `Datastore` client behind `pyfelix apply/delete/get`.

Role: create, replace and remove resources in a directory or single-file datastore so that
the running `FileSyncer`s (which watch the same files) see exactly the intended change.

Inputs: resource documents (dicts) and keys. Outputs: files written atomically (a hidden
temporary in the same directory, fsync, rename; the watcher ignores hidden names, so it
sees only the final file).

Where a resource is written:
- a key that already exists is replaced where it is defined (the winning definition),
  and other (shadowed, duplicate) definitions of it are removed;
  - a file holding only that resource is rewritten (YAML or JSON, as it was);
  - one document of a multi-document YAML file: only that document's lines are replaced
    or removed; the other documents keep their text and comments; the result is re-parsed
    and checked to hold exactly the expected documents before it is written;
  - an item inside a `kind: List` document, or one value of a multi-value JSON file:
    REFUSED with a message naming file and document (rewriting would lose the layout);
- a new key: directory datastore -> `<root>/<kind-lower>/[<namespace>/]<name>.yaml`
  (appended as a new document if that file already exists); single-file datastore ->
  appended to the file as a new YAML document.
- a file left with no document is removed, and so are directories it leaves empty
  (never the datastore root).

Invariants: every input document is checked (keyable, the `validate` hook, names usable as
file names, no key twice) and every edit is planned before the first byte is written; any
problem raises and nothing is written. Concurrent `pyfelix` writers are serialised by an
flock on a hidden lock file (`.pyfelix.lock`). Each file is replaced atomically, but an
apply touching several files is not one transaction.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from pyfelix.agent.inputs import InputSyntaxError, decode_yaml_documents
from pyfelix.agent.syncer.api import DatastoreError, ResourceKey, key_of
from pyfelix.agent.syncer.client import (
    ApplyResult,
    DatastoreClientError,
    ResourceNotFound,
    Validator,
    minimal_validate,
)
from pyfelix.agent.syncer.file import (
    JSON_SUFFIX,
    RESOURCE_SUFFIXES,
    DatastoreTree,
    ParsedDoc,
    ParsedFile,
    is_hidden_name,
    load_path,
    parse_text,
    path_order,
)
from pyfelix.agent.syncer.write_checks import checked_documents

_YamlLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YamlDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
LOCK_NAME = ".pyfelix.lock"


def dump_yaml(doc: Mapping[str, Any]) -> str:
    return yaml.dump(dict(doc), Dumper=_YamlDumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True)


def dump_json(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


# --------------------------------------------------------------------------------------------
# What the datastore holds now, with locations


@dataclass
class _StoredFile:
    path: str
    text: str
    parsed: ParsedFile


@dataclass
class _Layout:
    files: dict[str, _StoredFile]
    definitions: dict[ResourceKey, list[ParsedDoc]]  # sorted: the last one wins


def _read_layout(tree: DatastoreTree) -> _Layout:
    files: dict[str, _StoredFile] = {}
    definitions: dict[ResourceKey, list[ParsedDoc]] = {}
    for path in tree.walk(tree.root):
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise DatastoreClientError(f"cannot read {path}: {exc}; nothing was written") from exc
        parsed = parse_text(path, text)
        files[path] = _StoredFile(path, text, parsed)
        for doc in parsed.docs:
            definitions.setdefault(doc.key, []).append(doc)
    for docs in definitions.values():
        docs.sort(key=lambda d: (path_order(_path_of(d)), d.position))
    return _Layout(files, definitions)


def _path_of(doc: ParsedDoc) -> str:
    return doc.source.rsplit("#", 1)[0]


# --------------------------------------------------------------------------------------------
# Planning and performing file edits


@dataclass
class _FileEdit:
    path: str
    stored: _StoredFile | None  # None: a new file
    replacements: dict[int, dict[str, Any] | None] = field(default_factory=dict)  # doc -> new
    appended: list[dict[str, Any]] = field(default_factory=list)


def _document_spans(text: str) -> list[tuple[int, int]]:
    """Per document: (first line, line after the last), 0-based, from the YAML events."""
    starts = [event.start_mark.line for event in yaml.parse(text, Loader=_YamlLoader)
              if isinstance(event, yaml.DocumentStartEvent)]
    line_count = len(text.splitlines())
    return [(start, starts[i + 1] if i + 1 < len(starts) else line_count)
            for i, start in enumerate(starts)]


def _decoded_documents(path: str, text: str) -> list[Any]:
    """Every document's value (None for an empty one), read as the datastore reads them;
    a document the datastore would reject stops the edit (its text cannot be checked)."""
    values: list[Any] = []
    try:
        for document in decode_yaml_documents(text):
            if document.error is not None:
                raise DatastoreClientError(
                    f"cannot edit {path} safely: its document {document.index} is rejected "
                    f"({document.error}); nothing was written: fix the file by hand")
            values.append(document.value)
    except InputSyntaxError as exc:
        raise DatastoreClientError(f"cannot edit {path} safely: {exc}; nothing was written"
                                   ) from exc
    return values


def _all_documents(path: str, text: str) -> list[Any]:
    return [doc for doc in _decoded_documents(path, text) if doc is not None]


def _has_content(lines: Sequence[str]) -> bool:
    return any(line.strip() and not line.lstrip().startswith("#") for line in lines)


def _render_yaml_edit(edit: _FileEdit) -> str:
    text = edit.stored.text if edit.stored else ""
    lines = text.splitlines(keepends=True)
    spans = _document_spans(text) if text else []
    out: list[str] = list(lines[: spans[0][0]]) if spans else list(lines)
    for number, (start, end) in enumerate(spans, start=1):
        if number not in edit.replacements:
            out.extend(lines[start:end])
            continue
        new = edit.replacements[number]
        if new is None:
            continue
        explicit = lines[start].startswith("---") if start < len(lines) else False
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out.append(("---\n" if explicit or _has_content(out) else "") + dump_yaml(new))
    for doc in edit.appended:
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out.append(("---\n" if _has_content(out) else "") + dump_yaml(doc))
    return "".join(out)


def _check_yaml_edit(edit: _FileEdit, new_text: str) -> None:
    """Refuse to write unless the new text holds exactly the intended documents."""
    old_docs: list[Any] = []
    if edit.stored is not None:
        old_docs = _decoded_documents(edit.path, edit.stored.text)
    kept_or_replaced = [edit.replacements.get(number, doc)  # a None replacement removes
                        for number, doc in enumerate(old_docs, start=1)]
    expected = [doc for doc in kept_or_replaced if doc is not None] + list(edit.appended)
    if _all_documents(edit.path, new_text) != expected:
        raise DatastoreClientError(
            f"cannot edit {edit.path} safely (its document layout is unusual); nothing was "
            "written: edit the file by hand")


def _atomic_write(path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                     dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _EditPlan:
    """Edits to make, collected and checked before anything is written."""

    def __init__(self, layout: _Layout) -> None:
        self._layout = layout
        self._edits: dict[str, _FileEdit] = {}

    def _edit_for(self, path: str) -> _FileEdit:
        if path not in self._edits:
            self._edits[path] = _FileEdit(path, self._layout.files.get(path))
        return self._edits[path]

    def _check_editable(self, doc: ParsedDoc, action: str) -> _FileEdit:
        path = _path_of(doc)
        stored = self._layout.files[path]
        where = f"{path}#{doc.doc_index}"
        if doc.item_index is not None:
            raise DatastoreClientError(
                f"cannot {action} {doc.key}: it is defined inside a List document "
                f"({doc.source}); edit that file by hand or split the list into separate "
                "documents; nothing was written")
        if path.endswith(JSON_SUFFIX) and stored.parsed.document_count > 1:
            raise DatastoreClientError(
                f"cannot {action} {doc.key}: {where} is one of several JSON values in one "
                "file; edit that file by hand; nothing was written")
        return self._edit_for(path)

    def replace(self, doc: ParsedDoc, new: dict[str, Any]) -> None:
        self._check_editable(doc, "replace").replacements[doc.doc_index] = new

    def remove(self, doc: ParsedDoc) -> None:
        self._check_editable(doc, "remove").replacements[doc.doc_index] = None

    def add(self, path: str, new: dict[str, Any]) -> None:
        stored = self._layout.files.get(path)
        if stored is not None and (stored.parsed.failed or path.endswith(JSON_SUFFIX)):
            reason = "does not parse" if stored.parsed.failed else "is a JSON file"
            raise DatastoreClientError(
                f"cannot add {key_of(new)} to {path}: the file {reason}; nothing was written")
        self._edit_for(path).appended.append(new)

    def render(self) -> dict[str, str | None]:
        """New text per file (None: remove the file); raises before anything is written."""
        rendered: dict[str, str | None] = {}
        for path, edit in self._edits.items():
            if path.endswith(JSON_SUFFIX):
                new = edit.replacements.get(1)
                rendered[path] = None if new is None else dump_json(new)
                continue
            text = _render_yaml_edit(edit)
            _check_yaml_edit(edit, text)
            rendered[path] = text if _has_content(text.splitlines()) else None
        return rendered


# --------------------------------------------------------------------------------------------
# The client


class FileDatastore:
    """`agent.syncer.client.Datastore` for a directory or single-file datastore."""

    def __init__(self, path: str | os.PathLike[str], *, single_file: bool | None = None,
                 validate: Validator = minimal_validate) -> None:
        self.path = os.path.normpath(os.fspath(path))
        if single_file is None:
            single_file = os.path.isfile(self.path) or (
                not os.path.exists(self.path) and self.path.endswith(RESOURCE_SUFFIXES))
        self.single_file = single_file
        self._validate = validate
        self._warnings: list[DatastoreError] = []

    @property
    def description(self) -> str:
        return f"file datastore {self.path}"

    @property
    def warnings(self) -> list[DatastoreError]:
        return list(self._warnings)

    # -- reads --

    def get(self, kind: str, name: str | None = None,
            namespace: str | None = None) -> list[dict[str, Any]]:
        return [
            value for key, value in sorted(self.list().items())
            if key.kind == kind and (name is None or key.name == name)
            and (namespace is None or key.namespace == namespace)
        ]

    # -- writes --

    def apply(self, docs: Sequence[Mapping[str, Any]], *,
              sources: Sequence[str] | None = None) -> list[ApplyResult]:
        keyed = self._checked(docs, sources)
        results: list[ApplyResult] = []
        with self._locked():
            layout = _read_layout(self._tree())
            plan = _EditPlan(layout)
            for key, doc in keyed:
                definitions = layout.definitions.get(key, [])
                if not definitions:
                    plan.add(self._new_file_for(key), doc)
                    results.append(ApplyResult(key, "created"))
                    continue
                winner = definitions[-1]
                for shadowed in definitions[:-1]:
                    plan.remove(shadowed)
                if winner.value == doc and len(definitions) == 1:
                    results.append(ApplyResult(key, "unchanged"))
                    continue
                plan.replace(winner, doc)
                results.append(ApplyResult(key, "configured"))
            self._write(plan.render())
        return results

    def delete(self, key: ResourceKey) -> None:
        with self._locked():
            if not os.path.exists(self.path):
                raise ResourceNotFound(f"{key} not found: {self.path} does not exist")
            layout = _read_layout(self._tree())
            definitions = layout.definitions.get(key)
            if not definitions:
                raise ResourceNotFound(f"{key} not found in {self.description}")
            plan = _EditPlan(layout)
            for doc in definitions:
                plan.remove(doc)
            self._write(plan.render())

    # -- helpers --

    def _tree(self) -> DatastoreTree:
        return DatastoreTree(self.path, single_file=self.single_file)

    def _checked(self, docs: Sequence[Mapping[str, Any]],
                 sources: Sequence[str] | None) -> list[tuple[ResourceKey, dict[str, Any]]]:
        keyed = checked_documents(
            docs, sources, self._validate,
            None if self.single_file else _check_file_name_parts)
        if self.single_file and self.path.endswith(JSON_SUFFIX) and keyed:
            self._refuse_json_single_file()
        return keyed

    def _refuse_json_single_file(self) -> None:
        if not os.path.exists(self.path):
            raise DatastoreClientError(
                f"cannot create {self.path}: new single-file datastores are YAML (.yaml/.yml)")

    def _new_file_for(self, key: ResourceKey) -> str:
        if self.single_file:
            return self.path
        parts = [self.path, key.kind.lower()]
        if key.namespace:
            parts.append(key.namespace)
        return os.path.join(*parts, f"{key.name}.yaml")

    def _write(self, rendered: Mapping[str, str | None]) -> None:
        if not self.single_file:
            os.makedirs(self.path, exist_ok=True)
        for path in sorted(rendered, key=path_order):
            text = rendered[path]
            if text is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self._prune_empty_directories(os.path.dirname(path))
            else:
                _atomic_write(path, text)

    def _prune_empty_directories(self, directory: str) -> None:
        if self.single_file:
            return
        root = self.path
        while directory != root and directory.startswith(root + os.sep):
            try:
                os.rmdir(directory)
            except OSError:
                return
            directory = os.path.dirname(directory)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.single_file:
            directory = os.path.dirname(self.path) or "."
            lock_path = os.path.join(directory, f".{os.path.basename(self.path)}.lock")
        else:
            directory = self.path
            lock_path = os.path.join(directory, LOCK_NAME)
        os.makedirs(directory, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def list(self) -> dict[ResourceKey, dict[str, Any]]:
        if not os.path.exists(self.path):
            raise DatastoreClientError(f"datastore path {self.path} does not exist")
        updates, errors = load_path(self.path)
        self._warnings = errors
        return {update.key: update.value for update in updates if update.value is not None}


def _check_file_name_parts(key: ResourceKey, doc: Mapping[str, Any]) -> None:
    for field_name, value in (("metadata.name", key.name), ("metadata.namespace", key.namespace)):
        if not value:
            continue
        if os.sep in value or "\0" in value or is_hidden_name(value):
            raise ValueError(f"{key}: field '{field_name}' {value!r} cannot be used as a file "
                             "name (no '/', no leading '.')")
