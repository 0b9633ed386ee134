"""The grammar engine both the router and the shard use: llguidance (docs/architecture.md, "Guided generation").

The router turns every grammar a request asks for (a JSON schema, a regex, the tool grammar) into one
llguidance grammar text and checks it against the model's vocabulary at validation; the shard builds
a matcher from that text and computes token masks with it. Both read the same tokenizer.json, so the
router refuses exactly what the shard could not follow. llguidance has no dependencies and no torch,
so the router may import this module.

JSON is generated in one canonical layout (", " and ": " separators, no other whitespace): a small
model left free to emit whitespace can fill its whole budget with it, and a fixed layout makes the
keys and separators forced tokens (docs/architecture.md, "Guided generation": forced tokens).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance

from tgictl.errors import ConfigError
from tgictl.proto.messages import Grammar, GrammarType

# llguidance's JSON options (its JsonCompileOptions); a schema's own "x-guidance" key overrides them.
JSON_LAYOUT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def load_tokenizer(model_dir: Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> llguidance.LLTokenizer:
    """The model's vocabulary as llguidance sees it (about 0.5 s for 49,152 tokens: build it once).
    Ids from len(tokenizer) up to vocab_size (padding rows of the LM head) are never allowed."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"{model_dir} has no tokenizer.json: grammars need the model's vocabulary")
    return llguidance.LLTokenizer(path.read_text(encoding="utf-8"), n_vocab=vocab_size, eos_token=list(eos_token_ids))


def json_schema_grammar(schema: dict[str, Any], *, strict: bool) -> str:
    """strict: every keyword must be enforced, or the grammar is an error naming it; otherwise
    keywords llguidance cannot enforce are ignored (llguidance's `lenient`)."""
    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={**JSON_LAYOUT, "lenient": not strict})


def regex_grammar(regex: str) -> str:
    return llguidance.LLMatcher.grammar_from_regex(regex)


def lark_grammar(lark: str) -> str:
    return llguidance.LLMatcher.grammar_from_lark(lark)


def to_llguidance(grammar: Grammar) -> str:
    """The llguidance text of a wire grammar (the router sends LLGUIDANCE; the others as TGI's)."""
    if grammar.type == GrammarType.LLGUIDANCE:
        return grammar.value
    if grammar.type == GrammarType.REGEX:
        return regex_grammar(grammar.value)
    if grammar.type == GrammarType.JSON:
        try:
            schema = json.loads(grammar.value)
        except json.JSONDecodeError as err:
            raise ValueError(f"the JSON grammar is not JSON: {err}") from None
        return json_schema_grammar(schema, strict=False)
    raise ValueError(f"grammar type {grammar.type.name} has no grammar")


def grammar_error(grammar: str, tokenizer: llguidance.LLTokenizer) -> str | None:
    """Why llguidance cannot use `grammar` with this vocabulary, or None."""
    message = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
    return message.strip() or None
