"""Grammars after reasoning: the think text is free, what follows the end tag is the request's grammar, a
budget forces the end tag once spent, and every form (JSON, regex, tools, none) composes."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest
from tokenizers import Tokenizer

from tgictl.runtime.guidance import load_tokenizer
from tgictl.runtime.router.guided.grammars import GrammarRequest, GrammarValidator
from tgictl.runtime.router.guided.reasoning import ReasoningGrammar
from tgictl.runtime.router.guided.tools import call_text, plan_tools
from tgictl.testing.tiny_thinking import THINK_TAGS

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def tokenizer(thinking_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(thinking_model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def ll(thinking_model_dir: Path) -> llguidance.LLTokenizer:
    config = json.loads((thinking_model_dir / "config.json").read_text())
    return load_tokenizer(thinking_model_dir, config["vocab_size"], (config["eos_token_id"],))


def reasoning(tokenizer: Tokenizer, opening: str = "inside", budget: int | None = None) -> ReasoningGrammar:
    ids = {tag: tokenizer.token_to_id(tag) for tag in THINK_TAGS}
    return ReasoningGrammar.for_tags(*THINK_TAGS, ids, opening, budget)  # type: ignore[arg-type]


def matcher(ll: llguidance.LLTokenizer, request: GrammarRequest) -> llguidance.LLMatcher:
    compiled = GrammarValidator(ll).compile(request)
    return llguidance.LLMatcher(ll, compiled.value, log_level=0)


def follows(ll: llguidance.LLTokenizer, tokenizer: Tokenizer, request: GrammarRequest, text: str) -> bool:
    m = matcher(ll, request)
    return m.consume_tokens(tokenizer.encode(text, add_special_tokens=False).ids) and m.is_accepting()


def test_tags_that_are_tokens_are_referred_to_by_id(tokenizer: Tokenizer) -> None:
    grammar = reasoning(tokenizer)
    assert grammar.start == f"<[{tokenizer.token_to_id('<think>')}]>" and grammar.end.startswith("<[")
    as_text = ReasoningGrammar.for_tags("<r>", "</r>", {}, "inside", None)
    assert as_text.start == '"<r>"' and not as_text.tags_are_tokens
    with pytest.raises(ValueError, match="budget needs an end tag that is one token"):
        ReasoningGrammar.for_tags("<r>", "</r>", {}, "inside", 5)


def test_tags_that_are_only_text_end_the_think_text_lazily(ll: llguidance.LLTokenizer, tokenizer: Tokenizer) -> None:
    # `<r>` and `</r>` are not tokens of this vocabulary: the model writes them in pieces.
    text_tags = ReasoningGrammar.for_tags("<r>", "</r>", {}, "inside", None)
    wrapped = GrammarRequest("json", GrammarRequest.json_schema(SCHEMA, strict=True).value, True, text_tags)
    assert follows(ll, tokenizer, wrapped, 'thinking {"a": </r>\n{"a": 5}')
    assert follows(ll, tokenizer, wrapped, '<r>thinking</r>{"a": 5}')
    assert not follows(ll, tokenizer, wrapped, 'thinking</r>not json')


@pytest.mark.parametrize(("request_", "answer", "wrong"), [
    (GrammarRequest.json_schema(SCHEMA, strict=True), '{"a": 12}', '{"b": 1}'),
    (GrammarRequest("regex", "[0-9]+/x"), "42/x", "x42"),
    (GrammarRequest("text", ""), "anything at all", None),
], ids=["json", "regex", "text"])
def test_the_grammar_constrains_only_what_follows_the_reasoning(
    ll: llguidance.LLTokenizer, tokenizer: Tokenizer, request_: GrammarRequest, answer: str, wrong: str | None
) -> None:
    wrapped = GrammarRequest(request_.kind, request_.value, request_.strict, reasoning(tokenizer))
    free = "Free text: {not json} </thin 2<3 "
    assert follows(ll, tokenizer, wrapped, f"{free}</think>\n\n{answer}")
    assert follows(ll, tokenizer, wrapped, f"<think>{free}</think>{answer}")  # a start tag of its own, once
    if wrong is not None:
        assert not follows(ll, tokenizer, wrapped, f"{free}</think>{wrong}")
    # Only the tag ends the reasoning: text after it that the grammar refuses never passes as think text.
    assert not follows(ll, tokenizer, wrapped, answer)


def test_an_optional_think_block(ll: llguidance.LLTokenizer, tokenizer: Tokenizer) -> None:
    wrapped = GrammarRequest.json_schema(SCHEMA, strict=True)
    wrapped = GrammarRequest(wrapped.kind, wrapped.value, True, reasoning(tokenizer, "optional"))
    assert follows(ll, tokenizer, wrapped, '{"a": 1}')
    assert follows(ll, tokenizer, wrapped, '<think>first</think>\n{"a": 1}')
    assert not follows(ll, tokenizer, wrapped, 'first</think>{"a": 1}')


def test_tool_calls_after_reasoning(ll: llguidance.LLTokenizer, tokenizer: Tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]
    plan = plan_tools(tools, "required")
    assert plan is not None and plan.grammar is not None
    wrapped = GrammarRequest(plan.grammar.kind, plan.grammar.value, True, reasoning(tokenizer))
    assert follows(ll, tokenizer, wrapped, "plan: call f</think>\n" + call_text("f", {"a": 3}))
    assert not follows(ll, tokenizer, wrapped, "plan</think>no call")


def test_a_spent_budget_forces_the_end_tag(ll: llguidance.LLTokenizer, tokenizer: Tokenizer) -> None:
    wrapped = GrammarRequest.json_schema(SCHEMA, strict=True)
    wrapped = GrammarRequest(wrapped.kind, wrapped.value, True, reasoning(tokenizer, budget=3))
    m = matcher(ll, wrapped)
    think = tokenizer.encode("one two three four", add_special_tokens=False).ids
    assert m.consume_tokens(think[:2]) and m.compute_ff_tokens() == []
    assert m.consume_token(think[2])
    # The budget is spent: the end tag is forced (whitespace may follow it, so nothing more is)...
    assert m.compute_ff_tokens() == [tokenizer.token_to_id("</think>")]
    assert m.consume_token(tokenizer.token_to_id("</think>"))
    # ... and then the answer is the JSON's.
    assert m.consume_tokens(tokenizer.encode("{", add_special_tokens=False).ids)
    assert tokenizer.decode(m.compute_ff_tokens()) == '"a": '
    assert not m.consume_tokens(tokenizer.encode("more thinking", add_special_tokens=False).ids)
