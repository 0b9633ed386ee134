"""HTTP plumbing: NaN-free JSON, SSE framing, error responses."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from starlette.requests import ClientDisconnect

from tgictl.errors import OverloadedError
from tgictl.proto.messages import FinishReason
from tgictl.runtime.router.http.responses import (
    KEEP_ALIVE,
    SSEResponse,
    TgiJSONResponse,
    dumps,
    error_response,
    finite,
    in_bursts,
    sse,
    until_disconnect,
)
from tgictl.runtime.router.request import EndEvent, TokenEvent, TokenInfo
from tgictl.runtime.router.scheduling.event_channel import EventChannel


def test_non_finite_floats_become_null() -> None:
    value = {"a": float("nan"), "b": [1.5, float("inf"), {"c": float("-inf")}], "d": (2, "x")}
    assert finite(value) == {"a": None, "b": [1.5, None, {"c": None}], "d": [2, "x"]}
    assert json.loads(dumps(value)) == {"a": None, "b": [1.5, None, {"c": None}], "d": [2, "x"]}
    assert TgiJSONResponse({"logprob": float("nan")}).body == b'{"logprob":null}'


def test_sse_framing() -> None:
    assert sse({"index": 1, "text": "a\nb"}) == 'data: {"index":1,"text":"a\\nb"}\n\n'
    assert sse("[DONE]") == "data: [DONE]\n\n"


def test_error_response_defaults_to_tgi_shape() -> None:
    response = error_response(OverloadedError())
    assert response.status_code == 429
    assert json.loads(response.body) == {"error": "Model is overloaded", "error_type": "overloaded"}


def test_sse_response_releases_even_when_the_client_left_before_the_first_byte() -> None:
    closed: list[str] = []

    async def body() -> AsyncIterator[str]:
        try:
            yield sse({"index": 1})
        finally:
            closed.append("body")

    async def receive() -> dict[str, object]:
        return {"type": "http.disconnect"}

    async def send(message: object) -> None:
        raise OSError("client gone")  # what an ASGI 2.4 server does once the peer left

    async def scenario() -> None:
        response = SSEResponse(body(), on_close=lambda: closed.append("permit"))
        with pytest.raises(ClientDisconnect):
            await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)

    asyncio.run(scenario())
    assert closed == ["permit"]  # the body never started, so only the permit had to go back


def test_until_disconnect_cancels_the_work() -> None:
    cancelled: list[bool] = []

    async def work() -> str:
        try:
            await asyncio.sleep(10)
            return "done"
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    class GoneRequest:
        async def receive(self) -> dict[str, object]:
            return {"type": "http.disconnect"}

    class StayingRequest:
        async def receive(self) -> dict[str, object]:
            await asyncio.sleep(10)
            return {"type": "http.disconnect"}

    async def quick() -> str:
        return "answer"

    assert asyncio.run(until_disconnect(GoneRequest(), work())) is None  # type: ignore[arg-type]
    assert cancelled == [True]
    assert asyncio.run(until_disconnect(StayingRequest(), quick())) == "answer"  # type: ignore[arg-type]


def test_events_delivered_together_leave_in_one_write_and_a_lone_one_at_once() -> None:
    token = TokenInfo(id=7, text="a", logprob=-0.5, special=False)
    channel = EventChannel(1)
    closed: list[str] = []

    async def texts() -> AsyncIterator[str]:
        try:
            while not channel.done:
                item = await channel.next()
                if item is not None:
                    yield sse({"kind": type(item[1]).__name__})
        finally:
            closed.append("texts")

    async def run() -> list[str]:
        writes: list[str] = []
        bursts = in_bursts(channel, texts())
        sink = channel.sinks[0]
        for _ in range(3):  # a multi-step Decode answer: three tokens delivered at once
            sink.send(TokenEvent(token=token, top_tokens=(), content="a"))
        writes.append(await bursts.__anext__())
        reader = asyncio.ensure_future(bursts.__anext__())
        await asyncio.sleep(0)
        sink.send(TokenEvent(token=token, top_tokens=(), content="a"))  # a lone token, while the reader waits
        writes.append(await reader)
        sink.send(EndEvent(token=token, top_tokens=(), content="a", generated_text="aaaaa",
                           finish_reason=FinishReason.LENGTH, generated_tokens=5, seed=None, stop_sequence=None,
                           input_length=3, queued_s=0.0, inference_s=0.0))
        writes.extend([text async for text in bursts])
        return writes

    writes = asyncio.run(run())
    token_event = sse({"kind": "TokenEvent"})
    assert writes == [token_event * 3, token_event, sse({"kind": "EndEvent"})]
    assert closed == ["texts"]


def test_closing_the_bursts_closes_the_stream_they_read() -> None:
    channel = EventChannel(1)
    closed: list[str] = []

    async def texts() -> AsyncIterator[str]:
        try:
            yield KEEP_ALIVE
            await channel.next()
            yield "never"
        finally:
            closed.append("texts")

    async def run() -> str:
        bursts = in_bursts(channel, texts())
        first = await bursts.__anext__()
        await bursts.aclose()  # SSEResponse does this when the client leaves between writes
        return first

    assert asyncio.run(run()) == KEEP_ALIVE
    assert closed == ["texts"]
