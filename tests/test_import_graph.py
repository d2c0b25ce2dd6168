"""The tree's structure, checked: no import cycle anywhere, one namespace (nothing imports
the bare top-level names), and one place each for the `--datastore` parser and the kind
catalogue (the layering itself is import-linter's job: contracts in pyproject.toml, run by
`make lint`)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import grimp

from pyfelix.agent.kinds import KIND_BY_NAME, KINDS

REPO = Path(__file__).resolve().parents[1]
# the real files (pyfelix/agent, pyfelix/cli and pyfelix/confd are links to the top-level
# directories), as paths relative to the repository
SOURCES = [p for top in ("agent", "cli", "confd", "pyfelix/lab", "pyfelix/bench")
           for p in (REPO / top).rglob("*.py")] + [REPO / "pyfelix" / "__init__.py"]


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in graph.modules:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(
                        graph.find_modules_directly_imported_by(child)))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle() -> None:
    sys.path.insert(0, str(REPO))
    graph = grimp.build_graph("pyfelix")
    assert len(graph.modules) > 150  # the links were followed: the whole tree is in it
    assert _cycles(graph) == []


def test_one_namespace() -> None:
    """Every import names the pyfelix package: a module imported as `agent.x` AND as
    `pyfelix.agent.x` would be loaded twice (two registries, two sets of metrics)."""
    bare = r"^\s*(from|import)\s+(agent|cli|confd|lab|bench)\b"
    tests = [p for p in (REPO / "tests").rglob("*.py")]
    assert [p for p in SOURCES + tests if re.search(bare, p.read_text(), re.M)] == []
    for top in ("agent", "cli", "confd"):
        link = REPO / "pyfelix" / top
        assert link.is_symlink() and link.resolve() == (REPO / top).resolve()


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclepkg import b\n")
    (pkg / "b.py").write_text("from cyclepkg import a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        graph = grimp.build_graph("cyclepkg", cache_dir=None)
    finally:
        sys.path.remove(str(tmp_path))
    assert _cycles(graph) == [["cyclepkg.a", "cyclepkg.b"]]


def _defining(pattern: str) -> list[str]:
    regex = re.compile(pattern, re.M)
    return sorted(str(p.relative_to(REPO)) for p in SOURCES if regex.search(p.read_text()))


def test_one_datastore_parser_and_one_kind_catalogue() -> None:
    assert _defining(r"^def parse_datastore_url\(") == ["agent/datastore.py"]
    assert _defining(r"^class DatastoreLocation\b") == ["agent/datastore.py"]
    # only that parser takes a URL apart at its scheme
    assert _defining(r"""["']://["']""") == ["agent/datastore.py"]
    # the parser is called only at the edge (the CLI's --datastore option type)
    assert _defining(r"parse_datastore_url\(") == ["agent/datastore.py", "cli/params.py"]
    # one kind catalogue: KindInfo and every API resource are declared in agent/kinds.py,
    # and no other module spells a Calico kind's plural as a string (the etcd, Kubernetes and
    # CLI tables are views of the catalogue, which derives them)
    assert _defining(r"^class KindInfo\b") == ["agent/kinds.py"]
    assert _defining(r"^(BGP_KINDS|KINDS|NAMESPACED_KINDS)\b[^=\n]*=") == ["agent/kinds.py"]
    assert _defining(r"\bResourceType\(") == ["agent/kinds.py"]
    plurals = "|".join(info.plural for info in KINDS if info.kube and info.kube.is_crd)
    # (a JSON field that happens to be named like a plural, `{"tiers": ...}` or `d["tiers"]`
    # in explain's output, is not a kind's plural: dictionary keys and subscripts are skipped)
    assert _defining(rf"(?<!\[)[\"']({plurals})[\"'](?!\s*[:\]])") == ["agent/kinds.py"]


def test_the_model_parses_exactly_the_catalogue_kinds() -> None:
    from pyfelix.agent.model import KNOWN_KINDS

    assert frozenset(KIND_BY_NAME) == KNOWN_KINDS


def test_the_catalogue_invariants() -> None:
    kinds = [info.kind for info in KINDS]
    forms = [(info.api_version, info.document_kind) for info in KINDS]
    plurals = [(info.etcd_directory, info.plural) for info in KINDS]
    assert len(set(kinds)) == len(kinds)
    assert len(set(forms)) == len(forms)
    assert len(set(plurals)) == len(plurals)  # one etcd directory per kind
    for info in KINDS:
        # read from its own resource, or derived from other kinds, in the Kubernetes datastore
        assert (info.kube is None) == bool(info.derived_from), info.kind
        assert all(source in KIND_BY_NAME for source in info.derived_from)
