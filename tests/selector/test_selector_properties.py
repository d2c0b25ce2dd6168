"""Property tests over generated selectors (hypothesis).

The generator builds selector syntax trees of its own (plain tuples, independent of
`agent.selector.nodes`), renders them to text in many spellings (random whitespace, quote
styles, set orders and duplicates, minimal or redundant parentheses) and checks:
1. canonical form: every spelling of a tree, and the tree with operands of && / ||
   shuffled, gives one canonical text, and parsing the canonical text gives it back;
2. evaluation agrees with `reference_eval`, a naive tree-walking interpreter written
   here from Calico's documented semantics, on random label sets (for both the original
   text and its canonical form);
3. required_labels is sound: whenever a selector matches, the labels satisfy it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pyfelix.agent.selector import MAX_NESTING, NAMESPACE_LABEL, parse

# keys include prefixes, the namespace label, odd characters and words the grammar uses
KEYS = ["a", "b", "app.kubernetes.io/name", NAMESPACE_LABEL, "x-y_z", "in", "has", "not", "1.x"]
VALUES = ["", "x", "xy", "yx", "a'b", 'a"b', "1", "x y"]
COMPARISONS = ["==", "!=", "contains", "starts with", "ends with"]

Tree = tuple  # ("has", k) | ("all",) | ("global",) | ("cmp", op, k, v) | ("set", k, vs, neg)
#               | ("not", t) | ("and", t, t, ...) | ("or", t, t, ...)

keys = st.sampled_from(KEYS)
values = st.sampled_from(VALUES)
comparisons = st.tuples(st.just("cmp"), st.sampled_from(COMPARISONS), keys, values)
value_sets = st.tuples(st.just("set"), keys, st.lists(values, max_size=4).map(tuple), st.booleans())
leaves = st.one_of(  # comparisons and sets listed twice: they carry most of the semantics
    st.tuples(st.just("has"), keys),
    st.just(("all",)),
    st.just(("global",)),
    comparisons,
    comparisons,
    value_sets,
    value_sets,
)


def _extend(children: st.SearchStrategy[Tree]) -> st.SearchStrategy[Tree]:
    return st.one_of(
        st.tuples(st.just("not"), children),
        st.lists(children, min_size=2, max_size=3).map(lambda ops: ("and", *ops)),
        st.lists(children, min_size=2, max_size=3).map(lambda ops: ("or", *ops)),
    )


trees = st.recursive(leaves, _extend, max_leaves=10)
label_sets = st.dictionaries(keys, values, max_size=len(KEYS))


# --- reference interpreter ---------------------------------------------------------------


def reference_eval(tree: Tree, labels: Mapping[str, str]) -> bool:
    kind = tree[0]
    if kind == "has":
        return tree[1] in labels
    if kind == "all":
        return True
    if kind == "global":
        return NAMESPACE_LABEL not in labels
    if kind == "cmp":
        _, op, key, value = tree
        if key not in labels:
            return op == "!="  # only != matches an absent label
        actual = labels[key]
        return {
            "==": actual == value,
            "!=": actual != value,
            "contains": value in actual,
            "starts with": actual.startswith(value),
            "ends with": actual.endswith(value),
        }[op]
    if kind == "set":
        _, key, members, negated = tree
        inside = key in labels and labels[key] in members
        return not inside if negated else inside
    if kind == "not":
        return not reference_eval(tree[1], labels)
    if kind == "and":
        return all(reference_eval(t, labels) for t in tree[1:])
    if kind == "or":
        return any(reference_eval(t, labels) for t in tree[1:])
    raise AssertionError(tree)


# --- rendering in many spellings ----------------------------------------------------------

PRECEDENCE = {"or": 1, "and": 2, "not": 3}


class Renderer:
    """Renders a tree to selector text; `rnd` picks whitespace, quotes and parentheses."""

    def __init__(self, rnd: random.Random, minimal_parens: bool) -> None:
        self.rnd = rnd
        self.minimal = minimal_parens

    def ws(self, required: bool = False) -> str:
        pick = self.rnd.choice(["", "", " ", " ", "  ", "\t", "\n"])
        return pick or (" " if required else "")

    def quote(self, value: str) -> str:
        if "'" in value:
            return f'"{value}"'
        if '"' in value:
            return f"'{value}'"
        return self.rnd.choice(['"', "'"]).join(["", value, ""])

    def leaf(self, tree: Tree) -> str:
        kind, ws = tree[0], self.ws
        if kind == "has":
            return f"has{ws()}({ws()}{tree[1]}{ws()})"
        if kind in ("all", "global"):
            return f"{kind}{ws()}({ws()})"
        if kind == "cmp":
            _, op, key, value = tree
            spelled = op.replace(" ", ws(required=True))
            before = ws(required=op[0].isalpha())
            return f"{key}{before}{spelled}{ws()}{self.quote(value)}"
        _, key, members, negated = tree
        members = list(members)
        self.rnd.shuffle(members)
        if members and self.rnd.random() < 0.2:
            members.append(members[0])  # duplicates do not matter
        body = f"{ws()},{ws()}".join(self.quote(m) for m in members)
        op = f"not{ws(required=True)}in" if negated else "in"
        return f"{key}{ws(required=True)}{op}{ws()}{{{ws()}{body}{ws()}}}"

    def render(self, tree: Tree, min_precedence: int = 0) -> str:
        kind = tree[0]
        if kind == "not":
            text = f"!{self.ws()}{self.render(tree[1], 3)}"
        elif kind in ("and", "or"):
            joiner = f"{self.ws()}{'&&' if kind == 'and' else '||'}{self.ws()}"
            child_min = PRECEDENCE[kind] + (0 if self.minimal else 9)
            text = joiner.join(self.render(t, child_min) for t in tree[1:])
        else:
            text = self.leaf(tree)
        precedence = PRECEDENCE.get(kind, 4)
        needs_parens = precedence < min_precedence
        if needs_parens or (not self.minimal and self.rnd.random() < 0.15):
            return f"({self.ws()}{text}{self.ws()})"
        return text


def depth(tree: Tree) -> int:
    if tree[0] in ("not", "and", "or"):
        return 2 + max(depth(t) for t in tree[1:])  # a '!' or '(' per level, at most 2
    return 1


def shuffled(tree: Tree, rnd: random.Random) -> Tree:
    """The same selector with the operands of every && and || in another order."""
    if tree[0] in ("and", "or"):
        operands = [shuffled(t, rnd) for t in tree[1:]]
        rnd.shuffle(operands)
        return (tree[0], *operands)
    if tree[0] == "not":
        return ("not", shuffled(tree[1], rnd))
    return tree


def spell(tree: Tree, seed: int, minimal: bool) -> str:
    return Renderer(random.Random(seed), minimal).render(tree)


COMMON = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@COMMON
@given(tree=trees, seed=st.integers(0, 2**32), minimal=st.booleans())
def test_canonical_form_round_trips_and_ignores_spelling(tree: Tree, seed: int, minimal: bool):
    assume(depth(tree) < MAX_NESTING)
    rnd = random.Random(seed)
    canonical = parse(spell(tree, seed, minimal)).canonical
    assert parse(canonical).canonical == canonical
    assert parse(spell(tree, seed + 1, not minimal)).canonical == canonical
    assert parse(spell(shuffled(tree, rnd), seed + 2, minimal)).canonical == canonical


@COMMON
@given(
    tree=trees,
    seed=st.integers(0, 2**32),
    minimal=st.booleans(),
    labels=st.lists(label_sets, min_size=1, max_size=10),
)
def test_evaluation_agrees_with_reference_interpreter(
    tree: Tree, seed: int, minimal: bool, labels: list[dict[str, str]]
):
    assume(depth(tree) < MAX_NESTING)
    text = spell(tree, seed, minimal)
    selector = parse(text)
    from_canonical = parse(selector.canonical)
    for label_set in labels:
        expected = reference_eval(tree, label_set)
        assert selector.evaluate(label_set) is expected, (text, label_set)
        assert from_canonical.evaluate(label_set) is expected, (selector.canonical, label_set)


@COMMON
@given(tree=trees, labels=st.lists(label_sets, min_size=1, max_size=8))
def test_required_labels_hold_for_every_match(tree: Tree, labels: list[dict[str, str]]):
    assume(depth(tree) < MAX_NESTING)
    selector = parse(spell(tree, 0, True))
    required = selector.required_labels()
    for label_set in labels:
        if not selector.evaluate(label_set):
            continue
        for key, allowed in required.items():
            assert key in label_set, (selector.canonical, label_set, required)
            if allowed is not None:
                assert label_set[key] in allowed, (selector.canonical, label_set, required)


@COMMON
@given(tree=trees)
def test_required_labels_hold_for_a_constructed_match(tree: Tree):
    """Build a label set the selector matches (when the search finds one) and check it."""
    assume(depth(tree) < MAX_NESTING)
    selector = parse(spell(tree, 0, True))
    rnd = random.Random(repr(tree))
    for _ in range(30):
        candidate = {k: rnd.choice(VALUES) for k in KEYS if rnd.random() < 0.6}
        if selector.evaluate(candidate):
            for key, allowed in selector.required_labels().items():
                assert key in candidate
                assert allowed is None or candidate[key] in allowed
            return


def test_every_leaf_agrees_with_reference_exhaustively():
    """Each operator x each value x each label state (absent or any value), no sampling."""
    from itertools import combinations

    leaves_all: list[Tree] = [("all",), ("global",), ("has", "a")]
    leaves_all += [("cmp", op, "a", v) for op in COMPARISONS for v in VALUES]
    for size in range(3):
        for members in combinations(VALUES, size):
            leaves_all += [("set", "a", members, False), ("set", "a", members, True)]
    states: list[dict[str, str]] = [{}, {NAMESPACE_LABEL: "ns"}]
    states += [{"a": v} for v in VALUES]
    for leaf in leaves_all:
        for negate in (False, True):
            tree = ("not", leaf) if negate else leaf
            selector = parse(spell(tree, 0, True))
            for labels in states:
                assert selector.evaluate(labels) is reference_eval(tree, labels), (tree, labels)
