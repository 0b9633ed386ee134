"""EventChannel: events in order, keep-alive timeouts, cancellation by close, shutdown by fail."""

from __future__ import annotations

import asyncio

from tgictl.errors import GenerationError
from tgictl.proto.messages import FinishReason
from tgictl.runtime.router.request import EndEvent, ErrorEvent, TokenEvent, TokenInfo
from tgictl.runtime.router.scheduling.event_channel import EventChannel, events

TOKEN = TokenInfo(id=7, text="a", logprob=-0.5, special=False)


def token_event() -> TokenEvent:
    return TokenEvent(token=TOKEN, top_tokens=(), content="a")


def end_event() -> EndEvent:
    return EndEvent(token=TOKEN, top_tokens=(), content="a", generated_text="aa", finish_reason=FinishReason.LENGTH,
                    generated_tokens=2, seed=None, stop_sequence=None, input_length=3, queued_s=0.0, inference_s=0.0)


def test_events_of_several_generations_arrive_in_order_until_done() -> None:
    channel = EventChannel(2)
    first, second = channel.sinks
    first.send(token_event())
    second.send(token_event())
    second.send(end_event())
    first.send(end_event())

    async def read() -> list[tuple[int, object]]:
        got = []
        while not channel.done:
            item = await channel.next()
            assert item is not None
            got.append((item[0], type(item[1])))
        return got

    assert asyncio.run(read()) == [(0, TokenEvent), (1, TokenEvent), (1, EndEvent), (0, EndEvent)]
    assert set(channel.ends) == {0, 1}


def test_next_waits_for_the_batcher_and_times_out_for_keep_alive() -> None:
    async def scenario() -> list[object]:
        channel = EventChannel(1)
        loop = asyncio.get_running_loop()
        loop.call_later(0.15, channel.sinks[0].send, token_event())
        ticks = [await channel.next(0.05), await channel.next(0.05)]  # nothing yet: two keep-alive ticks
        event = await channel.next(1.0)
        return ticks + [type(event[1]) if event else None]

    assert asyncio.run(scenario()) == [None, None, TokenEvent]


def test_close_cancels_running_generations_once() -> None:
    cancels: list[int] = []
    closes: list[EventChannel] = []
    channel = EventChannel(2, on_cancel=lambda: cancels.append(1))
    channel.on_close(closes.append)
    channel.sinks[0].send(end_event())
    assert not channel.sinks[1].is_cancelled()
    channel.close()
    channel.close()
    assert channel.sinks[1].is_cancelled() and cancels == [1] and closes == [channel]


def test_a_complete_channel_closes_without_waking_the_batcher() -> None:
    cancels: list[int] = []
    channel = EventChannel(1, on_cancel=lambda: cancels.append(1))
    channel.sinks[0].send(end_event())
    channel.close()
    assert cancels == []


def test_fail_ends_what_runs_with_the_error_and_ignores_late_events() -> None:
    cancels: list[int] = []
    channel = EventChannel(2, on_cancel=lambda: cancels.append(1))
    channel.sinks[0].send(end_event())
    channel.fail(GenerationError("shutting down"))
    channel.sinks[1].send(token_event())  # the batcher's step that was already under way

    async def read() -> list[object]:
        return [type(e) async for e in events(channel)]

    assert asyncio.run(read()) == [EndEvent, ErrorEvent]
    assert isinstance(channel.ends[1], ErrorEvent) and cancels == [1] and channel.closed
