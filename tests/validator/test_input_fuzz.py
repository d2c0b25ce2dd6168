"""Fuzz: no exception but the documented ones escapes one document, whatever the input.

The documented error types, per entry point:
- `agent.syncer.file.parse_text` (the file datastore, `pyfelix apply -f`, `pyfelix calc`):
  raises nothing; a syntax error fails the file, a rejected document is one error;
- `agent.inputs.decode_json_document` (etcd values, later the Typha wire): `InputError`;
  `agent.inputs.decode_json` (Kubernetes transport): `ValueError`, then `check_document`
  per object: `InputError`;
- `agent.model.parse_resource` and `agent.validator.validate_document`: `ValidationError`;
  the pipeline's `Validator` never raises, and never takes the internal-error path;
- `agent.selector.parse`: `SelectorError`.

Inputs: raw YAML and JSON text (valid documents with textual mutations, hostile shapes:
deep nesting up to past every recursion limit, alias bombs, recursive anchors, duplicate
keys, huge integers, impossible dates, unknown tags; and plain random text), structured
documents (mutated examples with hostile values: deep nesting, huge integers, odd Python
types), and selector text (token soup and random text).

Derandomized and bounded (`max_examples`, `deadline`): 7,200 cases, about 20 s on the
CI machine.
"""

from __future__ import annotations

import copy
import datetime
import json
from datetime import timedelta
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfelix.agent import selector
from pyfelix.agent.model import ValidationError, parse_resource
from pyfelix.agent.syncer.api import RawUpdate, key_of
from pyfelix.agent.syncer.file import parse_text
from pyfelix.agent.validator import Validator, validate_document
from tests.model.examples import documents
from tests.model.test_model_fuzz import junk, mutated_documents

EXAMPLES = documents()


def fuzz(count: int) -> settings:
    return settings(max_examples=count, derandomize=True, database=None,
                    deadline=timedelta(seconds=5),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# --- raw text --------------------------------------------------------------------------------

YAML_SNIPPETS = [
    "\n", ": ", "- ", "---\n", "...\n", "&a ", "*a", "<<: *a\n", "? ", "!!str ", "!!int ",
    "!!binary ", "!!set ", "!!omap ", "!custom ", "{", "}", "[", "]", "'", '"', "#", "|\n",
    ">\n", "\t", "%YAML 1.1\n", "2001-02-30", "9" * 5000, "0x" + "f" * 300, "1:2:3",
    "\u00e9", "\x00", "\ufeff", "kind: GlobalNetworkPolicy\n", "action: Allow\n",
    "metadata: {name: x}\n",
]
JSON_SNIPPETS = [
    "{", "}", "[", "]", ",", ":", '"', "\\", '"\\u0000"', "null", "true", "1e999",
    "-" + "9" * 5000, '"a": 1', '"kind": "X"', "\n", " ", "\ud800",
]


def _deep(depth: int, opener: str, closer: str) -> str:
    return opener * depth + closer * depth


@st.composite
def mutated_text(draw: st.DrawFn, dump: Any, snippets: list[str]) -> str:
    doc = copy.deepcopy(draw(st.sampled_from(EXAMPLES)))
    text = dump(doc)
    for _ in range(draw(st.integers(0, 4))):
        position = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "delete", "duplicate-line"]))
        if action == "insert":
            text = text[:position] + draw(st.sampled_from(snippets)) + text[position:]
        elif action == "delete":
            text = text[:position] + text[position + draw(st.integers(1, 20)):]
        else:
            lines = text.splitlines(keepends=True)
            if lines:
                i = draw(st.integers(0, len(lines) - 1))
                lines.insert(i, lines[i])
                text = "".join(lines)
    return text


def _alias_bomb(levels: int, width: int) -> str:
    lines = ["kind: GlobalNetworkSet", "metadata: {name: bomb}", "x0: &x0 [" +
             ", ".join(["lol"] * width) + "]"]
    lines += [f"x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * width) + "]"
              for i in range(1, levels)]
    return "\n".join([*lines, f"spec: {{nets: *x{levels - 1}}}"]) + "\n"


def _merge_bomb(levels: int) -> str:
    lines = ["kind: GlobalNetworkSet", "metadata: {name: merge}", "m0: &m0 {a: 1}"]
    lines += [f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}, *m{i - 1}]}}" for i in range(1, levels)]
    return "\n".join([*lines, f"spec: *m{levels - 1}"]) + "\n"


hostile_yaml = st.one_of(
    st.builds(lambda d: "kind: X\nmetadata: {name: d}\nspec: " + _deep(d, "[", "]") + "\n",
              st.integers(50, 1_500)),
    st.builds(lambda d: "kind: X\nmetadata: {name: d}\nspec:\n" + "".join(
        " " * (i + 1) + f"k{i}:\n" for i in range(d)) + " " * (d + 1) + "v\n",
              st.integers(50, 400)),
    st.builds(_alias_bomb, st.integers(2, 12), st.integers(2, 10)),
    st.builds(_merge_bomb, st.integers(2, 25)),
    st.just("kind: X\nmetadata: {name: r}\nspec: &a [*a, {b: *a}]\n"),
    st.just("kind: X\nmetadata: {name: u}\nspec: {a: 1, a: 2, b: {c: 1, c: 1}}\n"),
    st.just("kind: X\nmetadata: {name: i}\nspec: {a: " + "1" * 5000 + "}\n"),
    st.just("kind: X\nmetadata: {name: t, creationTimestamp: 2001-13-40}\n"),
    st.just("kind: X\nmetadata: {name: k}\n? [a, b]\n: c\n"),
    st.just("kind: X\nmetadata: {name: s}\nspec: !!set {a, b}\nx: !!binary aGk=\n"),
)
hostile_json = st.one_of(
    st.builds(lambda d, o: '{"kind": "X", "metadata": {"name": "d"}, "spec": '
              + (_deep(d, "[", "]") if o else '{"a": ' * d + "1" + "}" * d) + "}",
              st.integers(50, 3_000), st.booleans()),
    st.builds(lambda d: "[" * d, st.integers(1, 3_000)),  # unbalanced
    st.just('{"kind": "X", "metadata": {"name": "u"}, "spec": {"a": 1, "a": 2}}'),
    st.just('{"kind": "X", "metadata": {"name": "i"}, "n": ' + "9" * 5000 + "}"),
    st.just('{"kind": "X", "metadata": {"name": "s"}} {"kind": "Y"} [1] "x" 3'),
)

yaml_texts = st.one_of(
    mutated_text(lambda d: yaml.safe_dump(d, sort_keys=False), YAML_SNIPPETS),
    st.lists(st.one_of(st.sampled_from(YAML_SNIPPETS), st.text(max_size=8)),
             max_size=30).map("".join),
    st.lists(st.one_of(hostile_yaml, mutated_text(yaml.safe_dump, YAML_SNIPPETS)),
             min_size=1, max_size=3).map("---\n".join),
)
json_texts = st.one_of(
    mutated_text(json.dumps, JSON_SNIPPETS),
    st.lists(st.one_of(st.sampled_from(JSON_SNIPPETS), st.text(max_size=8)),
             max_size=30).map("".join),
    st.lists(st.one_of(hostile_json, mutated_text(json.dumps, JSON_SNIPPETS)),
             min_size=1, max_size=3).map("\n".join),
)


def _validate_all(parsed_docs: Any) -> None:
    validator = Validator()
    for doc in parsed_docs:
        try:
            validate_document(doc.value)
        except ValidationError:
            pass
        validator.on_updates([RawUpdate(doc.key, doc.value, doc.source)])
    for reason in validator.errors.values():
        assert "internal error" not in reason, reason


def _check_parsed_file(path: str, text: str) -> None:
    parsed = parse_text(path, text)  # documented: never raises
    assert not (parsed.failed and parsed.docs)
    for error in parsed.errors:
        assert error.source.startswith(f"{path}#")
    _validate_all(parsed.docs)


@fuzz(1_800)
@given(yaml_texts)
def test_yaml_text_through_the_file_datastore_and_the_validator(text: str) -> None:
    _check_parsed_file("fuzz.yaml", text)


@fuzz(1_500)
@given(json_texts)
def test_json_text_through_the_file_datastore_and_the_validator(text: str) -> None:
    _check_parsed_file("fuzz.json", text)


@fuzz(600)
@given(json_texts, st.booleans())
def test_json_text_as_an_etcd_value_and_a_kubernetes_transport(text: str,
                                                                as_bytes: bool) -> None:
    from pyfelix.agent.inputs import InputError, check_document, decode_json, decode_json_document

    data: bytes | str = text.encode("utf-8", "surrogatepass") if as_bytes else text
    try:
        doc = decode_json_document(data, resource="GlobalNetworkPolicy(fuzz)")
    except InputError as exc:
        assert str(exc).startswith("GlobalNetworkPolicy(fuzz): ")
    else:
        assert isinstance(doc, dict)
        try:
            parse_resource(doc)
        except ValidationError:
            pass
    try:
        page = decode_json(data, wrapper_depth=2)
    except ValueError:
        return
    for item in page.get("items", [page]) if isinstance(page, dict) else [page]:
        try:
            check_document(item)
        except InputError:
            pass


# --- structured documents --------------------------------------------------------------------

def _nested(depth: int, container: str) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value] if container == "list" else {"k": value}
    return value


hostile_values = st.one_of(
    junk,
    st.builds(_nested, st.integers(100, 3_000), st.sampled_from(["list", "dict"])),
    st.just(10 ** 5000), st.just(-(10 ** 5000)), st.just(float("nan")),
    st.just(datetime.date(2001, 2, 3)), st.just(b"bytes"), st.just({1, 2}),
    st.just((1, "a")), st.just("\n"), st.just("a\nb"), st.just("x" * 20_000),
    st.just(["10.0.0.1"] * 100_001),
)


@st.composite
def hostile_documents(draw: st.DrawFn) -> Any:
    doc = draw(mutated_documents())
    if not isinstance(doc, dict):
        return doc
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else doc
    for _ in range(draw(st.integers(1, 2))):
        names = [*sorted(str(k) for k in spec), "selector", "nets", "ingress", "node"]
        key = draw(st.sampled_from(names))
        spec[key] = draw(hostile_values)
    return doc


@fuzz(1_500)
@given(hostile_documents())
def test_structured_documents_into_the_validator(doc: Any) -> None:
    try:
        resource = parse_resource(doc)
    except ValidationError as exc:
        assert str(exc).startswith(exc.resource)
        assert len(str(exc)) < 2_000  # described, never dumped
    else:
        hash(resource)
    try:
        validate_document(doc)
    except ValidationError:
        pass
    try:
        key = key_of(doc)
    except ValueError:
        return
    validator = Validator()
    validator.on_updates([RawUpdate(key, doc, "fuzz")])
    assert "internal error" not in validator.errors.get(key, "")


@fuzz(400)
@given(hostile_documents())
def test_structured_documents_through_the_per_object_check(doc: Any) -> None:
    from pyfelix.agent.inputs import InputError, check_document

    try:
        check_document(doc)
    except InputError as exc:
        assert len(str(exc)) < 2_000


# --- selectors -------------------------------------------------------------------------------

SELECTOR_TOKENS = ["a", "b.c/d", "has(", "all(", "global(", ")", "(", "!", "&&", "||", "==",
                   "!=", "in", "not", "contains", "starts", "ends", "with", "{", "}", ",",
                   "'v'", '"w"', "'", '"', "&", "|", "=", " ", "\n", "\t", "\u00e9", "\x00"]
selector_texts = st.one_of(
    st.lists(st.sampled_from(SELECTOR_TOKENS), max_size=40).map(" ".join),
    st.lists(st.sampled_from(SELECTOR_TOKENS), max_size=40).map("".join),
    st.text(max_size=60),
    st.builds(lambda n, op: "(" * n + "a == 'b'" + ")" * n if op else "!" * n + "has(a)",
              st.integers(0, 200), st.booleans()),
)


@fuzz(1_400)
@given(selector_texts)
def test_selectors(text: str) -> None:
    try:
        parsed = selector.parse(text)
    except selector.SelectorError as exc:
        assert 0 <= exc.position <= len(text)
    else:
        parsed.evaluate({"a": "b", "b.c/d": "v"})
    policy = {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
              "metadata": {"name": "fuzz"},
              "spec": {"selector": text, "ingress": [{"action": "Allow",
                                                      "source": {"selector": text}}]}}
    try:
        parse_resource(policy)
    except ValidationError as exc:
        assert exc.field.startswith("spec")
