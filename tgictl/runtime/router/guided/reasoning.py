"""A grammar that constrains only what follows a reasoning model's think text (docs/architecture.md,
"Guided generation": reasoning).

The request's own grammar (a JSON schema, a regex, the tool grammar) becomes a subgrammar `@answer` of a
llguidance grammar that first allows free text up to the end tag: the shard's matcher then masks nothing
while the model thinks and everything after it as the request asked. The think text may not contain the end
tag's text, so the only way out of the reasoning is the tag itself, as the router's splitter
(router/text/reasoning.py) reads it. A reasoning budget is llguidance's `max_tokens` on the think text: once
spent, the grammar allows only the end of the think text, so the end tag comes as forced tokens and the
answer follows, cleanly.

A tag that is one token of the vocabulary (Qwen3's, DeepSeek-R1's) is referred to by id (`<[id]>`):
llguidance treats added tokens as special, so the tag's text would not match the token the model writes.
A tag that is only text is matched lazily instead (the think text ends at the first end tag, which its
lexeme includes): llguidance's lexer cannot end a lexeme several bytes back, so "text without the tag, then
the tag" would refuse the tag's last byte. That form has no budget (`max_tokens` does not force the tag's
bytes), so a budget needs tags that are tokens (turn.py refuses it otherwise).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

# Whitespace after the end tag, before the answer ("</think>\n\n{...}"): bounded, or a small model left
# free to write whitespace can spend its whole budget on it (the reason JSON has a fixed layout too).
_GAP = r"/[ \t\r\n]{0,4}/"
FREE_TEXT_GRAMMAR = "start: ANSWER\nANSWER: /(?s:.*)/"


_REGEX_META = set("\\.^$|?*+()[]{}/-&~#")


def _escaped(text: str) -> str:
    """`text` as a literal inside a lark /regex/."""
    return "".join(f"\\{c}" if c in _REGEX_META else c for c in text)


def _not_containing(text: str) -> str:
    """A lark terminal matching any text that does not contain `text` (llguidance's `&` and `~`)."""
    return f"/(?s:.*)/ & ~/(?s:.*){_escaped(text)}(?s:.*)/"


@dataclass(frozen=True)
class ReasoningGrammar:
    """How the output begins (inside the reasoning, or with an optional think block) and its budget."""

    start: str  # the start tag as a lark item: `<[id]>` or a string literal
    end: str | None  # the end tag as `<[id]>`; None when it is only text (then matched lazily)
    end_text: str  # the end tag's text, which the think text may not contain
    opening: Literal["inside", "optional"]
    budget: int | None = None  # most tokens of think text (max_reasoning_tokens); only with `end`

    @classmethod
    def for_tags(
        cls, start_tag: str, end_tag: str, token_ids: dict[str, int | None], opening: Literal["inside", "optional"],
        budget: int | None,
    ) -> ReasoningGrammar:
        """token_ids: each tag's id when it is one token of the vocabulary."""

        start, end = token_ids.get(start_tag), token_ids.get(end_tag)
        if end is None and budget is not None:
            raise ValueError("a reasoning budget needs an end tag that is one token of the vocabulary")
        return cls(f"<[{start}]>" if start is not None else json.dumps(start_tag),
                   f"<[{end}]>" if end is not None else None, end_tag, opening, budget)

    @property
    def tags_are_tokens(self) -> bool:
        return self.end is not None

    def wrap(self, answer: str) -> str:
        """The llguidance grammar text: reasoning, the end tag, then `answer` (a compiled grammar text)."""
        if self.end is not None:  # the think text, then the tag's token
            think = f"think[max_tokens={self.budget}]: THINK" if self.budget is not None else "think: THINK"
            rules = [think, f"THINK: {_not_containing(self.end_text)}"]
            block = f"think {self.end} {_GAP}"
        else:  # the think text up to and with the first end tag
            rules = [f"think[lazy]: /(?s:.*){_escaped(self.end_text)}/"]
            block = f"think {_GAP}"
        if self.opening == "inside":  # a start tag the model writes itself is allowed once, first
            start = f"start: {self.start}? {block} @answer"
        else:
            start = f"start: ({self.start} {block})? @answer"
        top = "\n".join([start, *rules])
        return json.dumps({"grammars": [{"name": "reasoning", "lark_grammar": top}, {**_first(answer), "name": "answer"}]})


def _first(grammar: str) -> dict[str, object]:
    """The one grammar of a compiled text: llguidance's JSON form, or lark text as it is."""
    if grammar.lstrip().startswith("{"):
        grammars = json.loads(grammar)["grammars"]
        if len(grammars) != 1:
            raise ValueError("a grammar of several grammars cannot follow reasoning")
        return {k: v for k, v in grammars[0].items() if v is not None}
    return {"lark_grammar": grammar}
