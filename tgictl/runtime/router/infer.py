"""Between the HTTP routes and the batcher: concurrency permits, one event stream per request, and the
continuation of long generations (reference 5.8).

A round generates at most `max_new_tokens_per_round` tokens; when it ends on length with tokens still
owed, the request is queued again with the tokens it produced appended to its prompt (ids, not text:
nothing is re-tokenized) and the client sees one seamless stream whose totals cover every round.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tgictl.errors import OverloadedError
from tgictl.proto.messages import FinishReason
from tgictl.runtime.router.batcher import Batcher
from tgictl.runtime.router.queue import Entry
from tgictl.runtime.router.request import EndEvent, ErrorEvent, StreamEvent, TokenEvent, ValidatedRequest

_U64 = 2**64
_GOLDEN = 0x9E3779B97F4A7C15  # decorrelates the random streams of successive rounds


@dataclass(frozen=True)
class InferConfig:
    max_concurrent_requests: int = 128
    max_new_tokens_per_round: int = 1024
    max_total_tokens: int = 2048  # a continuation round must still fit input + new tokens


class Infer:
    def __init__(self, batcher: Batcher, config: InferConfig) -> None:
        self._batcher = batcher
        self._config = config
        self._in_use = 0

    @property
    def permits_in_use(self) -> int:
        return self._in_use

    @contextmanager
    def permit(self) -> Iterator[None]:
        """Hold one of max_concurrent_requests for the whole life of a request (429 when none left)."""
        if self._in_use >= self._config.max_concurrent_requests:
            raise OverloadedError()
        self._in_use += 1
        try:
            yield
        finally:
            self._in_use -= 1

    async def stream(self, request: ValidatedRequest) -> AsyncIterator[StreamEvent]:
        """Events of one request across all its rounds. Closing the iterator cancels the request."""
        owed = request.total_new_tokens
        produced: list[int] = []
        texts: list[str] = []
        round_index = 0
        current = request
        while True:
            last: EndEvent | None = None
            events, cancel = self._submit(current)
            try:
                while True:
                    event = await events.get()
                    if isinstance(event, EndEvent):
                        last = event
                        break
                    if isinstance(event, TokenEvent):
                        produced.append(event.token.id)
                    yield event
                    if isinstance(event, ErrorEvent):
                        return
            finally:
                cancel()  # a no-op for a finished round; frees the work of a client that left
            if last is None:
                return
            produced.append(last.token.id)
            texts.append(last.generated_text)
            following = self._next_round(request, produced, owed, round_index + 1) if (
                last.finish_reason == FinishReason.LENGTH
            ) else None
            if following is None:
                yield dataclasses.replace(
                    last,
                    generated_text="".join(texts),
                    generated_tokens=len(produced),
                    input_length=request.input_length,
                )
                return
            # The round's last token becomes an ordinary token of the one stream the client sees.
            yield TokenEvent(token=last.token, top_tokens=last.top_tokens, content=last.content)
            current = following
            round_index += 1

    def _next_round(
        self, original: ValidatedRequest, produced: list[int], owed: int, round_index: int
    ) -> ValidatedRequest | None:
        remaining = owed - len(produced)
        if remaining <= 0:
            return None
        input_ids = original.input_ids + tuple(produced)
        budget = min(remaining, self._config.max_new_tokens_per_round)
        if len(input_ids) + budget > self._config.max_total_tokens:
            return None  # the request has used the model's whole context: it ends on length
        sampling = original.sampling
        if sampling.samples:
            sampling = dataclasses.replace(sampling, seed=(sampling.seed + round_index * _GOLDEN) % _U64)
        return dataclasses.replace(
            original,
            input_ids=input_ids,
            sampling=sampling,
            max_new_tokens=budget,
            max_total_new_tokens=None,
            decoder_input_details=False,
        )

    def _submit(self, request: ValidatedRequest) -> tuple[asyncio.Queue[StreamEvent], Callable[[], None]]:
        events: asyncio.Queue[StreamEvent] = asyncio.Queue()
        gone = False

        def cancel() -> None:
            nonlocal gone
            if not gone:
                gone = True
                self._batcher.notify()

        self._batcher.enqueue(Entry(request=request, send=events.put_nowait, is_cancelled=lambda: gone))
        return events, cancel
