"""A chat turn's answer read as it streams: reasoning (with `--reasoning-parser`), text, and tool calls
(with tools), each piece as soon as it is known. The non-streaming routes feed the same reader the same
per-token texts, so a whole answer and a streamed one always agree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from tgictl.proto.messages import FinishReason
from tgictl.runtime.router.guided.tool_calls import CallArguments, CallStarted, ToolCall, ToolCallReader
from tgictl.runtime.router.guided.tools import ToolPlan
from tgictl.runtime.router.request import EndEvent
from tgictl.runtime.router.text.reasoning import ReasoningSplitter


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class Text:
    text: str


Piece = Reasoning | Text | CallStarted | CallArguments
# Why an answer ended, in words every API maps to its own: the model's end of turn, a stop sequence, the
# token limit, or calls the tool grammar closed.
Finish = Literal["stop", "stop_sequence", "length", "tool_calls"]


def finish_of(end: EndEvent, called: bool) -> Finish:
    if end.finish_reason == FinishReason.LENGTH:
        return "length"
    if end.finish_reason == FinishReason.STOP_SEQUENCE:
        return "stop_sequence"
    return "tool_calls" if called else "stop"


class AnswerReader:
    """Feed each token's text (TokenEvent.content) in order; `feed` returns the pieces it releases."""

    def __init__(self, tools: ToolPlan | None, reasoning: ReasoningSplitter | None) -> None:
        self.tools = ToolCallReader(text_allowed=tools.mode == "auto") if tools and tools.parses_calls else None
        self.reasoning = reasoning
        self.reasoning_tokens = 0  # tokens read while the model was thinking (end tag included)

    @property
    def called(self) -> bool:
        return self.tools is not None and bool(self.tools.calls)

    @property
    def calls(self) -> list[ToolCall]:
        return self.tools.calls if self.tools is not None else []

    def feed(self, content: str) -> list[Piece]:
        if self.reasoning is None:
            return self._answer(content)
        thinking = self.reasoning.thinking
        pieces: list[Piece] = []
        for kind, text in self.reasoning.feed(content):
            pieces += [Reasoning(text)] if kind == "reasoning" else self._answer(text)
        if thinking or self.reasoning.thinking:
            self.reasoning_tokens += 1
        return pieces

    def finish(self) -> list[Piece]:
        """The end of the answer: what was held back, then an answer that never became calls is text."""
        pieces: list[Piece] = []
        if self.reasoning is not None:
            for kind, text in self.reasoning.finish():
                pieces += [Reasoning(text)] if kind == "reasoning" else self._answer(text)
        if self.tools is not None:
            text, calls = self.tools.finish()
            pieces += ([Text(text)] if text else []) + list(calls)
        return pieces

    def _answer(self, text: str) -> list[Piece]:
        if self.tools is None:
            return [Text(text)] if text else []
        content, calls = self.tools.feed(text)
        return ([Text(content)] if content else []) + list(calls)


@dataclass
class Answer:
    """A whole answer: its reasoning (None without any), its text (None when it is only calls), its calls."""

    reasoning: str | None
    content: str | None
    calls: list[ToolCall] = field(default_factory=list)
    finish: Finish = "stop"
    reasoning_tokens: int = 0


def whole_answer(reader: AnswerReader, contents: Sequence[str], end: EndEvent) -> Answer:
    """Read a whole answer given as its tokens' texts (Outcome.contents)."""
    pieces = [piece for content in contents for piece in reader.feed(content)] + reader.finish()
    reasoning = "".join(p.text for p in pieces if isinstance(p, Reasoning))
    text = "".join(p.text for p in pieces if isinstance(p, Text))
    calls = reader.calls
    return Answer(
        reasoning=reasoning if reader.reasoning is not None and (reasoning or reader.reasoning_tokens) else None,
        content=None if calls and not text else text,
        calls=calls,
        finish=finish_of(end, bool(calls)),
        reasoning_tokens=reader.reasoning_tokens,
    )
