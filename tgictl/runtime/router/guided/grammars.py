"""A request's grammar, checked and compiled once at validation (docs/architecture.md, "Guided generation").

Every form a client can ask for — TGI's `parameters.grammar` (json, json_object, json_schema,
regex), OpenAI's `response_format`, and the tool grammar — becomes one llguidance grammar text here,
checked against the model's vocabulary and walked through its first steps (grammar_probe.py), so a bad
schema or regex, or one past the engine's limits, is a 422 naming the problem. Results (errors included) are cached by the
grammar's text: a schema sent with every request is compiled once.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import llguidance

from tgictl.errors import ValidationError
from tgictl.proto.messages import Grammar, GrammarType
from tgictl.runtime.guidance import grammar_error, json_schema_grammar, lark_grammar, load_tokenizer, regex_grammar
from tgictl.runtime.router.guided.grammar_probe import probe_error
from tgictl.runtime.router.guided.reasoning import FREE_TEXT_GRAMMAR, ReasoningGrammar

GrammarKind = Literal["json", "regex", "lark", "text"]

CACHED_GRAMMARS = 1024


@dataclass(frozen=True)
class GrammarRequest:
    """What a request asks its output to follow, before it is checked. `value` is a JSON schema's
    canonical JSON text, a regex, or a lark grammar (the tool grammar); kind "text" is any text (a
    reasoning budget without a grammar of its own)."""

    kind: GrammarKind
    value: str
    strict: bool = True  # JSON: refuse keywords llguidance cannot enforce (OpenAI's strict)
    # A reasoning model's think text comes first, free (guided/reasoning.py); the grammar constrains the rest.
    reasoning: ReasoningGrammar | None = None

    @classmethod
    def json_schema(cls, schema: object, *, strict: bool) -> GrammarRequest:
        if not isinstance(schema, dict):
            raise ValidationError("grammar is not valid: a JSON schema must be a JSON object")
        return cls("json", json.dumps(schema, sort_keys=False, ensure_ascii=False), strict)


def tgi_grammar(grammar: Any) -> GrammarRequest:
    """TGI's `parameters.grammar`: {"type": "json" | "json_object", "value": schema or its JSON text},
    {"type": "json_schema", "value": {"name"?, "schema"}}, {"type": "regex", "value": str}."""
    if not isinstance(grammar, dict) or not isinstance(grammar.get("type"), str):
        raise ValidationError("grammar is not supported: expected {\"type\": ..., \"value\": ...}")
    kind, value = grammar["type"], grammar.get("value")
    if kind in ("json", "json_object"):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValidationError(f"grammar is not valid: {err}") from None
        return GrammarRequest.json_schema(value, strict=True)
    if kind == "json_schema":
        schema = value.get("schema") if isinstance(value, dict) else None
        if schema is None:
            raise ValidationError("grammar is not valid: `json_schema` needs {\"schema\": ...}")
        return GrammarRequest.json_schema(schema, strict=True)
    if kind == "regex":
        if not isinstance(value, str):
            raise ValidationError("grammar is not valid: a regex grammar's value must be a string")
        return GrammarRequest("regex", value)
    raise ValidationError(
        f"grammar type `{kind}` is not supported: use `json`, `json_object`, `json_schema` or `regex`"
    )


def _one_line(message: str) -> str:
    """llguidance's messages span lines (with a caret under the fault); an error body has one."""
    lines = [line.strip() for line in message.splitlines()]
    return "; ".join(line for line in lines if line and set(line) != {"^"})


class GrammarValidator:
    """Compiles and checks grammars against the model's vocabulary; thread-safe (validation workers)."""

    def __init__(self, tokenizer: llguidance.LLTokenizer) -> None:
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        self._cache: OrderedDict[GrammarRequest, Grammar | str] = OrderedDict()

    @classmethod
    def for_model(cls, model_dir: Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> GrammarValidator:
        return cls(load_tokenizer(model_dir, vocab_size, eos_token_ids))

    def compile(self, request: GrammarRequest) -> Grammar:
        """The wire grammar, or ValidationError("grammar is not valid: ...") naming the problem."""
        with self._lock:
            cached = self._cache.get(request)
            if cached is not None:
                self._cache.move_to_end(request)
        if cached is None:
            cached = self._compile(request)
            with self._lock:
                self._cache[request] = cached
                while len(self._cache) > CACHED_GRAMMARS:
                    self._cache.popitem(last=False)
        if isinstance(cached, str):
            raise ValidationError(f"grammar is not valid: {cached}")
        return cached

    def _compile(self, request: GrammarRequest) -> Grammar | str:
        try:
            if request.kind == "json":
                text = json_schema_grammar(json.loads(request.value), strict=request.strict)
            elif request.kind == "regex":
                text = regex_grammar(request.value)
            elif request.kind == "lark":
                text = lark_grammar(request.value)
            else:
                text = FREE_TEXT_GRAMMAR
            if request.reasoning is not None:
                text = request.reasoning.wrap(text)
        except (ValueError, TypeError) as err:  # llguidance's own parse errors
            return _one_line(str(err))
        error = grammar_error(text, self.tokenizer) or probe_error(text, self.tokenizer)
        if error is not None:
            return _one_line(error)
        return Grammar(type=GrammarType.LLGUIDANCE, value=text)
