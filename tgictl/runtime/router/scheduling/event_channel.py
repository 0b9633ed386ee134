"""The one hop from the batching task to the HTTP handler that answers (docs/architecture.md, "The
token stream").

An HTTP request runs one generation, or several (`best_of`, OpenAI's `n`); their events arrive in one
EventChannel in the order the batcher produced them. Each generation's Entry holds a Sink: `send` is a
deque append, plus waking the handler when it waits. The handler reads with `next()`, which returns at
once while events are pending, so a busy stream costs no task, no timer and no queue per token; a
timeout (for SSE keep-alive comments) costs one timer only while nothing arrives.

Closing the channel is the handler's way to say nobody listens any more (a disconnect, or the answer
is complete): every Sink then reports cancelled, and the batcher drops what still runs before its next
step. `fail` ends every generation still running with an error event (shutdown) and closes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable

from tgictl.errors import TgictlError
from tgictl.runtime.router.request import EndEvent, ErrorEvent, StreamEvent

Item = tuple[int, StreamEvent]  # (generation index, event)


class Sink:
    """One generation's end of the channel, as its Entry sees it."""

    __slots__ = ("_channel", "index")

    def __init__(self, channel: EventChannel, index: int) -> None:
        self._channel = channel
        self.index = index

    def send(self, event: StreamEvent) -> None:
        self._channel.deliver(self.index, event)

    def is_cancelled(self) -> bool:
        return self._channel.closed


class EventChannel:
    def __init__(self, count: int, on_cancel: Callable[[], None] = lambda: None) -> None:
        self.sinks = tuple(Sink(self, i) for i in range(count))
        self.ends: dict[int, EndEvent | ErrorEvent] = {}  # the last event of each ended generation
        self.closed = False
        self._count = count
        self._pending: deque[Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._on_cancel = on_cancel  # wakes the batcher, so that it drops what still runs
        self._on_close: list[Callable[[EventChannel], None]] = []

    @property
    def done(self) -> bool:
        """Every generation ended and every event was read."""
        return len(self.ends) == self._count and not self._pending

    @property
    def has_pending(self) -> bool:
        """Whether `next()` would return an event at once."""
        return bool(self._pending)

    def deliver(self, index: int, event: StreamEvent) -> None:
        if index in self.ends:
            return  # after fail(): the batcher's late events for a generation already ended
        if isinstance(event, (EndEvent, ErrorEvent)):
            self.ends[index] = event
        self._pending.append((index, event))
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self, timeout_s: float | None = None) -> Item | None:
        """The next event; None when `timeout_s` passed without one, or when `done`."""
        if not self._pending and not self.done:
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            self._waiter = waiter
            timer = loop.call_later(timeout_s, _release, waiter) if timeout_s is not None else None
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        return self._pending.popleft() if self._pending else None

    def on_close(self, callback: Callable[[EventChannel], None]) -> None:
        self._on_close.append(callback)

    def fail(self, error: TgictlError) -> None:
        """End every generation still running with `error`, then close (the batcher drops them)."""
        running = len(self.ends) < self._count
        for index in range(self._count):
            self.deliver(index, ErrorEvent(error))
        self.close()
        if running:
            self._on_cancel()

    def close(self) -> None:
        """Nobody reads any more. Idempotent; runs the close callbacks once."""
        if self.closed:
            return
        self.closed = True
        if len(self.ends) < self._count:
            self._on_cancel()
        for callback in self._on_close:
            callback(self)


async def events(channel: EventChannel) -> AsyncIterator[StreamEvent]:
    """Every event of `channel` without keep-alive ticks; the channel closes when iteration stops."""
    try:
        while not channel.done:
            item = await channel.next()
            if item is not None:
                yield item[1]
    finally:
        channel.close()


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
