"""HTTP plumbing: NaN-free JSON, SSE framing, TGI's error body."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from starlette.requests import ClientDisconnect

from tgictl.errors import OverloadedError, ValidationError
from tgictl.runtime.router.http.responses import (
    SSEResponse,
    TgiJSONResponse,
    dumps,
    error_body,
    error_response,
    finite,
    sse,
    until_disconnect,
)


def test_non_finite_floats_become_null() -> None:
    value = {"a": float("nan"), "b": [1.5, float("inf"), {"c": float("-inf")}], "d": (2, "x")}
    assert finite(value) == {"a": None, "b": [1.5, None, {"c": None}], "d": [2, "x"]}
    assert json.loads(dumps(value)) == {"a": None, "b": [1.5, None, {"c": None}], "d": [2, "x"]}
    assert TgiJSONResponse({"logprob": float("nan")}).body == b'{"logprob":null}'


def test_sse_framing() -> None:
    assert sse({"index": 1, "text": "a\nb"}) == 'data: {"index":1,"text":"a\\nb"}\n\n'
    assert sse("[DONE]") == "data: [DONE]\n\n"


def test_error_body_keeps_tgi_shape() -> None:
    err = ValidationError("`top_k` must be strictly positive")
    assert error_body(err) == {"error": "Input validation error: `top_k` must be strictly positive",
                               "error_type": "validation"}
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
