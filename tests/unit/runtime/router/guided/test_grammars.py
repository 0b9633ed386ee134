"""Grammars at validation: TGI's and OpenAI's forms, errors that name the problem, the cache."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pytest

from tests.unit.runtime.router.guided.conftest import Follows
from tgictl.errors import ValidationError
from tgictl.proto.messages import GrammarType
from tgictl.runtime.router.guided.grammars import GrammarRequest, GrammarValidator, tgi_grammar
from tgictl.testing.grammar_cases import REGEXES, SCHEMAS


@pytest.fixture(scope="module")
def validator(ll_tokenizer: llguidance.LLTokenizer) -> GrammarValidator:
    return GrammarValidator(ll_tokenizer)


def test_tgi_forms() -> None:
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    as_object = tgi_grammar({"type": "json", "value": schema})
    assert as_object == tgi_grammar({"type": "json_object", "value": json.dumps(schema)})
    assert as_object == tgi_grammar({"type": "json_schema", "value": {"name": "x", "schema": schema}})
    assert json.loads(as_object.value) == schema and list(json.loads(as_object.value)["properties"]) == ["b", "a"]
    assert as_object.kind == "json" and as_object.strict
    assert tgi_grammar({"type": "regex", "value": "a+"}) == GrammarRequest("regex", "a+")


@pytest.mark.parametrize(("grammar", "message"), [
    ("json", "grammar is not supported"),
    ({"value": {}}, "grammar is not supported"),
    ({"type": "ebnf", "value": "x"}, "grammar type `ebnf` is not supported"),
    ({"type": "json", "value": "{oops"}, "grammar is not valid: Expecting property name"),
    ({"type": "json", "value": [1]}, "must be a JSON object"),
    ({"type": "json_schema", "value": {"name": "x"}}, "needs {\"schema\""),
    ({"type": "regex", "value": None}, "must be a string"),
])
def test_tgi_form_errors(grammar: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        tgi_grammar(grammar)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_test_schema_compiles_and_accepts_its_instance(validator: GrammarValidator, follows: Follows,
                                                             name: str) -> None:
    schema, instance = SCHEMAS[name]
    grammar = validator.compile(GrammarRequest.json_schema(schema, strict=True))
    assert grammar.type == GrammarType.LLGUIDANCE
    # The canonical layout: ", " and ": ", nothing else; other whitespace is refused.
    assert follows(grammar.value, json.dumps(instance))
    assert not follows(grammar.value, json.dumps(instance, indent=2))


@pytest.mark.parametrize("name", sorted(REGEXES))
def test_every_test_regex_matches_fully(validator: GrammarValidator, follows: Follows, name: str) -> None:
    regex, text = REGEXES[name]
    grammar = validator.compile(GrammarRequest("regex", regex))
    assert follows(grammar.value, text)
    assert not follows(grammar.value, text[:-1] + "\u00e9")


@pytest.mark.parametrize(("request_", "message"), [
    (GrammarRequest.json_schema({"type": "strin"}, strict=True), "grammar is not valid: .*strin"),
    (GrammarRequest.json_schema({"type": "string", "format": "nope"}, strict=True), "Unknown format: nope"),
    (GrammarRequest("regex", "a(b"), "unclosed group"),
    (GrammarRequest("regex", "[z-a]"), "grammar is not valid"),
    (GrammarRequest("lark", "start: undefined_rule"), "grammar is not valid"),
])
def test_errors_name_the_problem_on_one_line(validator: GrammarValidator, request_: GrammarRequest, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        validator.compile(request_)
    assert "\n" not in str(info.value) and info.value.http_status == 422


def test_strict_false_ignores_what_it_cannot_enforce(validator: GrammarValidator) -> None:
    schema = {"type": "string", "format": "nope"}
    assert validator.compile(GrammarRequest.json_schema(schema, strict=False)).value


def test_compiled_grammars_and_errors_are_cached(validator: GrammarValidator, monkeypatch: pytest.MonkeyPatch) -> None:
    good = GrammarRequest("regex", "(x|y){3}")
    bad = GrammarRequest("regex", "(x")
    first = validator.compile(good)
    with pytest.raises(ValidationError):
        validator.compile(bad)
    compiled: list[GrammarRequest] = []
    original = validator._compile
    monkeypatch.setattr(validator, "_compile", lambda r: compiled.append(r) or original(r))
    assert validator.compile(good) is first
    with pytest.raises(ValidationError, match="unclosed group"):
        validator.compile(bad)
    assert compiled == []  # neither was compiled again
    validator.compile(GrammarRequest("regex", "(x|y){4}"))
    assert len(compiled) == 1
