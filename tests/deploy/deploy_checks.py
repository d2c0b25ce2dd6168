"""Helpers for the deploy/ and vagrant/ tests: manifests, overlays, pyfelix command lines.

Role: read the Kubernetes manifests the way `kubectl apply -k` would see them, without a
cluster and without kubectl (which a fresh machine does not have), and check command lines
that the manifests and systemd units run against the real click CLI in `cli.main`.

- `load_documents(path)`: every YAML document of a file (empty documents dropped).
- `render_kustomization(directory)`: the documents a kustomization produces, for the subset of
  kustomize the repository uses: `resources` (files and directories), `patches` (strategic
  merge), `images` (newName/newTag). Any other kustomization field raises
  `UnsupportedKustomization`, so a new feature is never silently ignored here.
- `strategic_merge(base, patch)`: Kubernetes strategic merge for the list fields the patches
  touch (merge keys below); every other list is replaced whole, as for `command`.
- `load_vmlab()`: vagrant/demo/vmlab.py (a script beside the Vagrantfile) as a module.
- `command_problems(argv)`: why `argv` is not a valid pyfelix invocation ([] when it is):
  the subcommand must be in `cli.main.COMMANDS`, and its options must parse with click
  (unknown options and missing required ones are problems; nothing is run).

Easy to get wrong: the merge key of `volumeMounts` is `mountPath` and of `ports` is
`containerPort`, not `name`; env values keep `$(VAR)` as is (the kubelet expands them).
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import yaml

from pyfelix.cli.main import COMMANDS, cli

REPO = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPO / "deploy"
VAGRANT_DIR = REPO / "vagrant"

KUSTOMIZATION_FILE = "kustomization.yaml"
SUPPORTED_KUSTOMIZATION_FIELDS = frozenset({"apiVersion", "kind", "resources", "patches",
                                            "images"})
# Strategic-merge keys of the Kubernetes list fields (k8s.io/api patchMergeKey tags).
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}

Document = dict[str, Any]


class UnsupportedKustomization(ValueError):
    """A kustomization uses a field this renderer does not implement."""


def load_documents(path: Path) -> list[Document]:
    with path.open() as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    """`patch` merged into a copy of `base` (maps recursively, keyed lists by merge key)."""
    if isinstance(base, Mapping) and isinstance(patch, Mapping):
        merged = dict(copy.deepcopy(base))
        for key, value in patch.items():
            if str(key).startswith("$"):
                raise UnsupportedKustomization(f"patch directive {key!r} is not supported")
            merged[key] = (strategic_merge(merged[key], value, key)
                           if key in merged else copy.deepcopy(value))
        return merged
    merge_key = MERGE_KEYS.get(field)
    if merge_key and isinstance(base, list) and isinstance(patch, list):
        merged_items = [copy.deepcopy(item) for item in base]
        index = {item[merge_key]: i for i, item in enumerate(merged_items)}
        for item in patch:
            if item[merge_key] in index:
                position = index[item[merge_key]]
                merged_items[position] = strategic_merge(merged_items[position], item)
            else:
                merged_items.append(copy.deepcopy(item))
        return merged_items
    return copy.deepcopy(patch)


def _identity(doc: Mapping[str, Any]) -> tuple[str, str, str]:
    metadata = doc.get("metadata") or {}
    return (str(doc.get("kind")), str(metadata.get("namespace", "")), str(metadata["name"]))


def _apply_images(doc: Document, images: Sequence[Mapping[str, str]]) -> None:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        name, _, _tag = container["image"].partition(":")
        for image in images:
            if image["name"] == name:
                new_name = image.get("newName", name)
                container["image"] = f"{new_name}:{image['newTag']}" if "newTag" in image \
                    else new_name


def render_kustomization(directory: Path) -> list[Document]:
    """The documents `kubectl kustomize DIRECTORY` would print (for the supported subset)."""
    kustomization = load_documents(directory / KUSTOMIZATION_FILE)[0]
    unsupported = set(kustomization) - SUPPORTED_KUSTOMIZATION_FIELDS
    if unsupported:
        raise UnsupportedKustomization(
            f"{directory / KUSTOMIZATION_FILE}: fields {sorted(unsupported)} not supported")
    documents: list[Document] = []
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        documents.extend(render_kustomization(target) if target.is_dir()
                         else load_documents(target))
    by_identity = {_identity(doc): i for i, doc in enumerate(documents)}
    for patch_entry in kustomization.get("patches", []):
        for patch in load_documents(directory / patch_entry["path"]):
            identity = _identity(patch)
            if identity not in by_identity:
                raise UnsupportedKustomization(f"patch {patch_entry['path']} targets "
                                               f"{identity}, which no resource defines")
            position = by_identity[identity]
            documents[position] = strategic_merge(documents[position], patch)
    for doc in documents:
        _apply_images(doc, kustomization.get("images", []))
    return documents


def kustomization_files(directory: Path) -> set[Path]:
    """Every file a kustomization (and the ones it includes) reads."""
    kustomization = load_documents(directory / KUSTOMIZATION_FILE)[0]
    files = {(directory / KUSTOMIZATION_FILE).resolve()}
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        files |= kustomization_files(target) if target.is_dir() else {target}
    files |= {(directory / p["path"]).resolve() for p in kustomization.get("patches", [])}
    return files


def pod_templates(documents: Sequence[Document]) -> list[tuple[Document, Document]]:
    """(workload document, pod spec) for every DaemonSet/Deployment/StatefulSet/Job."""
    return [(doc, doc["spec"]["template"]["spec"]) for doc in documents
            if doc.get("kind") in {"DaemonSet", "Deployment", "StatefulSet", "Job"}]


def find(documents: Sequence[Document], kind: str, name: str) -> Document:
    matches = [d for d in documents if d.get("kind") == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def _leftover_args(ctx: click.Context) -> list[str]:
    # A group keeps its subcommand name apart from the rest (`protected_args`, private since
    # click 8.2); put them back together.
    protected = ctx.__dict__.get("_protected_args")
    if protected is None:
        protected = getattr(ctx, "protected_args", [])
    return [*protected, *ctx.args]


def command_problems(argv: Sequence[str]) -> list[str]:
    """Why `argv` (starting with `pyfelix` or a path ending in /pyfelix) is not a valid call."""
    if not argv or Path(argv[0]).name != "pyfelix":
        return [f"{list(argv)!r} does not run pyfelix"]
    if len(argv) < 2 or argv[1] not in COMMANDS:
        name = argv[1] if len(argv) > 1 else ""
        return [f"pyfelix has no subcommand {name!r} (known: {', '.join(sorted(COMMANDS))})"]
    parent = cli.make_context("pyfelix", [], resilient_parsing=True)
    command: click.Command | None = cli.get_command(parent, argv[1])
    assert command is not None
    name, args = argv[1], list(argv[2:])
    while True:
        try:
            ctx = command.make_context(name, list(args), parent=parent)
        except click.UsageError as exc:
            return [f"pyfelix {' '.join(argv[1:])}: {exc.format_message()}"]
        if not isinstance(command, click.Group):
            return []
        rest = _leftover_args(ctx)
        if not rest:
            return []
        sub_name, args = rest[0], rest[1:]
        sub = command.get_command(ctx, sub_name)
        if sub is None:
            return [f"pyfelix {name} has no subcommand {sub_name!r}"]
        parent, command, name = ctx, sub, sub_name


def load_vmlab() -> ModuleType:
    """vagrant/demo/vmlab.py imported as module `vmlab` (once per process)."""
    if "vmlab" in sys.modules:
        return sys.modules["vmlab"]
    spec = importlib.util.spec_from_file_location("vmlab", VAGRANT_DIR / "demo" / "vmlab.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["vmlab"] = module
    spec.loader.exec_module(module)
    return module
