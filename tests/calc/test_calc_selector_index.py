"""SelectorIndex: same matches as evaluating every pair, with far fewer evaluations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pyfelix.agent.calc.labels import LabelInheritIndex
from pyfelix.agent.calc.selector_index import SelectorIndex
from pyfelix.agent.selector import parse

KEYS = ["app", "role", "env", "projectcalico.org/namespace"]
VALUES = ["a", "b", "c"]


class Recorder:
    """Keeps the current match set from the callbacks (and checks they are consistent)."""

    def __init__(self) -> None:
        self.matches: set[tuple[object, object]] = set()

    def started(self, sel: object, item: object) -> None:
        assert (sel, item) not in self.matches
        self.matches.add((sel, item))

    def stopped(self, sel: object, item: object) -> None:
        self.matches.remove((sel, item))


def _index(naive: bool = False) -> tuple[SelectorIndex, Recorder]:
    rec = Recorder()
    return SelectorIndex(rec.started, rec.stopped, naive=naive), rec


leaf = st.one_of(
    st.builds(lambda k, v: f"{k} == '{v}'", st.sampled_from(KEYS), st.sampled_from(VALUES)),
    st.builds(lambda k, v: f"{k} != '{v}'", st.sampled_from(KEYS), st.sampled_from(VALUES)),
    st.builds(lambda k: f"has({k})", st.sampled_from(KEYS)),
    st.builds(lambda k: f"!has({k})", st.sampled_from(KEYS)),
    st.builds(lambda k, vs: f"{k} in {{{', '.join(repr(v) for v in vs)}}}",
              st.sampled_from(KEYS), st.lists(st.sampled_from(VALUES), max_size=2)),
    st.just("all()"), st.just("global()"),
)
selector_text = st.recursive(leaf, lambda inner: st.one_of(
    st.builds(lambda a, b: f"({a}) && ({b})", inner, inner),
    st.builds(lambda a, b: f"({a}) || ({b})", inner, inner),
    st.builds(lambda a: f"!({a})", inner)), max_leaves=4)
labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=4)

# an operation: ("sel", id, text | None) or ("item", id, labels | None)
operation = st.one_of(
    st.tuples(st.just("sel"), st.integers(0, 4), st.one_of(st.none(), selector_text)),
    st.tuples(st.just("item"), st.integers(0, 6), st.one_of(st.none(), labels)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=40))
def test_matches_equal_brute_force(operations: list) -> None:
    index, rec = _index()
    naive, naive_rec = _index(naive=True)
    selectors: dict[int, str] = {}
    items: dict[int, dict[str, str]] = {}
    for kind, ident, value in operations:
        for idx in (index, naive):
            if kind == "sel":
                if value is None:
                    idx.delete_selector(ident)
                else:
                    idx.update_selector(ident, parse(value))
            elif value is None:
                idx.delete_item(ident)
            else:
                idx.update_item(ident, value)
        target = selectors if kind == "sel" else items
        if value is None:
            target.pop(ident, None)
        else:
            target[ident] = value
        truth = {(s, i) for s, text in selectors.items() for i, lab in items.items()
                 if parse(text).evaluate(lab)}
        assert rec.matches == truth
        assert naive_rec.matches == truth
    for ident in list(selectors):
        index.delete_selector(ident)
    assert rec.matches == set()


def test_anchored_index_evaluates_only_candidates() -> None:
    index, rec = _index()
    naive, _ = _index(naive=True)
    for i in range(200):
        index.update_selector(f"s{i}", parse(f"app == 'app{i}'"))
        naive.update_selector(f"s{i}", parse(f"app == 'app{i}'"))
    index.evaluations = naive.evaluations = 0
    for j in range(1000):
        item_labels = {"app": f"app{j % 200}", "env": "prod"}
        index.update_item(j, item_labels)
        naive.update_item(j, item_labels)
    assert len(rec.matches) == 1000
    assert index.evaluations == 1000  # one candidate per item
    assert naive.evaluations == 200 * 1000


def test_selector_added_after_items_sees_only_its_bucket() -> None:
    index, rec = _index()
    for j in range(500):
        index.update_item(j, {"app": f"app{j % 50}"})
    index.evaluations = 0
    index.update_selector("s", parse("app == 'app7' && env != 'x'"))
    assert index.evaluations == 10
    assert {i for _, i in rec.matches} == {j for j in range(500) if j % 50 == 7}


def test_impossible_selector_matches_nothing_and_costs_nothing() -> None:
    index, rec = _index()
    index.update_item(1, {"a": "x"})
    index.evaluations = 0
    index.update_selector("s", parse("a == 'x' && a == 'y'"))
    index.update_item(2, {"a": "y"})
    assert index.evaluations == 0 and not rec.matches


def test_label_inheritance() -> None:
    seen: dict[object, dict[str, str] | None] = {}
    labels = LabelInheritIndex(lambda item, lab: seen.__setitem__(item, lab))
    labels.update_parent("p1", {"team": "red", "env": "p1"})
    labels.update_item("e", {"env": "own"}, ("p1", "p2"))
    assert seen["e"] == {"env": "own", "team": "red"}
    labels.update_parent("p2", {"team": "blue", "zone": "z"})
    assert seen["e"] == {"env": "own", "team": "red", "zone": "z"}
    labels.update_parent("p1", None)
    assert seen["e"] == {"env": "own", "team": "blue", "zone": "z"}
    labels.update_item("e", {"env": "own"}, ())
    assert seen["e"] == {"env": "own"}
    labels.delete_item("e")
    assert seen["e"] is None and len(labels) == 0
