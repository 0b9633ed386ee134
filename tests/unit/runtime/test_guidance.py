"""The shared grammar engine: the wire's grammar types to llguidance text, the canonical JSON layout,
the vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest

from tgictl.errors import ConfigError
from tgictl.proto.messages import Grammar, GrammarType
from tgictl.runtime.guidance import grammar_error, json_schema_grammar, load_tokenizer, regex_grammar, to_llguidance


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> llguidance.LLTokenizer:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    return load_tokenizer(tiny_model_dir, config["vocab_size"], (config["eos_token_id"],))


def accepts(tokenizer: llguidance.LLTokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()


def test_every_wire_type_becomes_llguidance_text(tokenizer: llguidance.LLTokenizer) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
    from_json = to_llguidance(Grammar(GrammarType.JSON, json.dumps(schema)))
    assert accepts(tokenizer, from_json, '{"a": 12}')
    assert not accepts(tokenizer, from_json, '{"a":12}')  # the canonical layout: ": " and ", " only
    assert not accepts(tokenizer, from_json, '{ "a": 12 }')
    compiled = json_schema_grammar(schema, strict=True)
    assert to_llguidance(Grammar(GrammarType.LLGUIDANCE, compiled)) == compiled
    assert accepts(tokenizer, to_llguidance(Grammar(GrammarType.REGEX, "a{2}b")), "aab")
    with pytest.raises(ValueError, match="not JSON"):
        to_llguidance(Grammar(GrammarType.JSON, "{"))
    with pytest.raises(ValueError, match="NONE has no grammar"):
        to_llguidance(Grammar(GrammarType.NONE, "x"))


def test_a_schema_may_choose_its_own_layout(tokenizer: llguidance.LLTokenizer) -> None:
    schema = {"type": "object", "x-guidance": {"whitespace_flexible": True}, "properties": {"a": {"type": "integer"}}}
    assert accepts(tokenizer, json_schema_grammar(schema, strict=True), '{ "a" :  1 }')


def test_errors_and_the_vocabulary(tokenizer: llguidance.LLTokenizer, tmp_path: Path) -> None:
    assert grammar_error(regex_grammar("ab"), tokenizer) is None
    assert "unclosed group" in (grammar_error(regex_grammar("(ab"), tokenizer) or "")
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        load_tokenizer(tmp_path, 10, (0,))
