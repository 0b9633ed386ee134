"""Grammars walked through their first steps at validation: what the engine cannot follow is a 422 that says
why; every grammar the tests generate with passes."""

from __future__ import annotations

import llguidance
import pytest

from tgictl.errors import ValidationError
from tgictl.runtime.guidance import json_schema_grammar
from tgictl.runtime.router.guided.grammar_probe import MAX_GRAMMAR_CHARS, probe_error
from tgictl.runtime.router.guided.grammars import GrammarRequest, GrammarValidator
from tgictl.testing.grammar_cases import HOSTILE_SCHEMAS, REGEXES, SCHEMAS


@pytest.mark.parametrize("name", sorted(HOSTILE_SCHEMAS))
def test_schemas_the_engine_cannot_follow_are_refused_at_validation(
    ll_tokenizer: llguidance.LLTokenizer, name: str
) -> None:
    validator = GrammarValidator(ll_tokenizer)
    with pytest.raises(ValidationError) as refused:
        validator.compile(GrammarRequest.json_schema(HOSTILE_SCHEMAS[name], strict=True))
    message = refused.value.message
    assert message.startswith("Input validation error: grammar is not valid: ")
    assert ("cannot follow it" in message or "allows no first token" in message) and "\n" not in message
    assert len(message) < 400  # the first line of the engine's error, not its parser state


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_followable_schemas_pass(ll_tokenizer: llguidance.LLTokenizer, name: str) -> None:
    assert probe_error(json_schema_grammar(SCHEMAS[name][0], strict=True), ll_tokenizer) is None


@pytest.mark.parametrize("name", sorted(REGEXES))
def test_followable_regexes_pass(ll_tokenizer: llguidance.LLTokenizer, name: str) -> None:
    assert probe_error(llguidance.LLMatcher.grammar_from_regex(REGEXES[name][0]), ll_tokenizer) is None


def test_a_recursive_schema_with_a_finite_instance_passes(ll_tokenizer: llguidance.LLTokenizer) -> None:
    tree = {"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "array",
            "items": {"$ref": "#"}}}, "required": ["name"]}
    assert probe_error(json_schema_grammar(tree, strict=True), ll_tokenizer) is None


def test_oversized_grammars_are_refused_before_they_are_compiled(ll_tokenizer: llguidance.LLTokenizer) -> None:
    enum = {"enum": [f"value number {i:07d}" for i in range(MAX_GRAMMAR_CHARS // 20)]}
    error = probe_error(json_schema_grammar(enum, strict=True), ll_tokenizer)
    assert error is not None and f"at most {MAX_GRAMMAR_CHARS}" in error
