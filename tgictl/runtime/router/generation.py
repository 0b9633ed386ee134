"""Running one validated request to its end for the non-streaming routes, and the token shapes both
APIs share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tgictl.errors import TgictlError
from tgictl.proto.messages import FinishReason
from tgictl.runtime.router.request import EndEvent, ErrorEvent, PrefillEvent, StreamEvent, TokenEvent, TokenInfo

TGI_FINISH_REASONS = {
    FinishReason.LENGTH: "length",
    FinishReason.EOS_TOKEN: "eos_token",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
}
# OpenAI knows only these two (issue 6: no "stop_sequence" / "eos_token" on the OpenAI routes).
OPENAI_FINISH_REASONS = {
    FinishReason.LENGTH: "length",
    FinishReason.EOS_TOKEN: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
}


class IncompleteGenerationError(TgictlError):
    """The request's stream ended without its last token (reference 2.8)."""

    http_status = 500
    error_type = "incomplete_generation"

    def __init__(self, message: str = "Incomplete generation") -> None:
        super().__init__(message)


@dataclass
class Outcome:
    """Everything one request produced."""

    end: EndEvent
    prefill: tuple[TokenInfo, ...] = ()
    tokens: list[TokenInfo] = field(default_factory=list)  # every generated token, the last included
    top_tokens: list[tuple[TokenInfo, ...]] = field(default_factory=list)  # one entry per token
    contents: list[str] = field(default_factory=list)  # user-visible text each token released

    @property
    def mean_logprob(self) -> float:
        values = [t.logprob for t in self.tokens]
        return sum(values) / len(values) if values else float("-inf")


async def collect(events: AsyncIterator[StreamEvent]) -> Outcome:
    """Drain a stream; raise the error it ended with, or IncompleteGenerationError."""
    prefill: tuple[TokenInfo, ...] = ()
    tokens: list[TokenInfo] = []
    tops: list[tuple[TokenInfo, ...]] = []
    contents: list[str] = []
    async for event in events:
        if isinstance(event, PrefillEvent):
            prefill = event.tokens
        elif isinstance(event, TokenEvent):
            tokens.append(event.token)
            tops.append(event.top_tokens)
            contents.append(event.content)
        elif isinstance(event, EndEvent):
            tokens.append(event.token)
            tops.append(event.top_tokens)
            contents.append(event.content)
            return Outcome(end=event, prefill=prefill, tokens=tokens, top_tokens=tops, contents=contents)
        elif isinstance(event, ErrorEvent):
            raise event.error
    raise IncompleteGenerationError()


async def collect_all(streams: Sequence[AsyncIterator[StreamEvent]]) -> list[Outcome]:
    """Every stream to its end, concurrently; the first failure cancels the others (and so their
    generations) before it is raised."""
    tasks = [asyncio.ensure_future(collect(stream)) for stream in streams]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def token_dict(token: TokenInfo) -> dict[str, Any]:
    return {"id": token.id, "text": token.text, "logprob": token.logprob, "special": token.special}


def prefill_dict(token: TokenInfo) -> dict[str, Any]:
    return {"id": token.id, "text": token.text, "logprob": token.logprob}


def tgi_text(end: EndEvent) -> str:
    """TGI keeps the stop string that ended the request in its text; EndEvent leaves it out."""
    return end.generated_text + (end.stop_sequence or "")
