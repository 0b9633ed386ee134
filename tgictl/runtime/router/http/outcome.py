"""Collecting a request's generations for the non-streaming routes, and the token shapes both APIs
share."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tgictl.proto.messages import FinishReason
from tgictl.runtime.router.request import EndEvent, ErrorEvent, PrefillEvent, TokenEvent, TokenInfo
from tgictl.runtime.router.scheduling.event_channel import EventChannel

TGI_FINISH_REASONS = {
    FinishReason.LENGTH: "length",
    FinishReason.EOS_TOKEN: "eos_token",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
}
# OpenAI knows only these two: no "stop_sequence" / "eos_token" on the OpenAI routes.
OPENAI_FINISH_REASONS = {
    FinishReason.LENGTH: "length",
    FinishReason.EOS_TOKEN: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
}


@dataclass
class Outcome:
    """Everything one request produced."""

    end: EndEvent
    prefill: tuple[TokenInfo, ...] = ()
    prefill_top: tuple[tuple[TokenInfo, ...], ...] = ()  # per prompt token, when top_n_tokens was asked
    tokens: list[TokenInfo] = field(default_factory=list)  # every generated token, the last included
    top_tokens: list[tuple[TokenInfo, ...]] = field(default_factory=list)  # one entry per token
    contents: list[str] = field(default_factory=list)  # user-visible text each token released

    @property
    def mean_logprob(self) -> float:
        """Over the sampled tokens: a token its grammar forced has no logprob (NaN)."""
        values = [t.logprob for t in self.tokens if not math.isnan(t.logprob)]
        return sum(values) / len(values) if values else float("-inf")


async def collect_all(channel: EventChannel) -> list[Outcome]:
    """Every generation of `channel` to its end; raises the first error one ended with. The channel
    is closed on the way out, which cancels what still runs (a failure, or a client that left)."""
    prefill: dict[int, PrefillEvent] = {}
    tokens: dict[int, list[TokenInfo]] = {}
    tops: dict[int, list[tuple[TokenInfo, ...]]] = {}
    contents: dict[int, list[str]] = {}
    outcomes: dict[int, Outcome] = {}
    try:
        while not channel.done:
            item = await channel.next()
            if item is None:
                continue
            index, event = item
            if isinstance(event, ErrorEvent):
                raise event.error
            if isinstance(event, PrefillEvent):
                prefill[index] = event
            elif isinstance(event, (TokenEvent, EndEvent)):
                tokens.setdefault(index, []).append(event.token)
                tops.setdefault(index, []).append(event.top_tokens)
                contents.setdefault(index, []).append(event.content)
                if isinstance(event, EndEvent):
                    asked = prefill.get(index)
                    outcomes[index] = Outcome(
                        end=event, prefill=asked.tokens if asked else (), prefill_top=asked.top_tokens if asked else (),
                        tokens=tokens[index], top_tokens=tops[index], contents=contents[index],
                    )
    finally:
        channel.close()
    return [outcomes[i] for i in sorted(outcomes)]


def token_dict(token: TokenInfo) -> dict[str, Any]:
    return {"id": token.id, "text": token.text, "logprob": token.logprob, "special": token.special}


def prefill_dict(token: TokenInfo) -> dict[str, Any]:
    return {"id": token.id, "text": token.text, "logprob": token.logprob}


def tgi_text(end: EndEvent) -> str:
    """TGI keeps the stop string that ended the request in its text; EndEvent leaves it out."""
    return end.generated_text + (end.stop_sequence or "")
