"""The bench client: request bodies per API, and streams read into records (token counts from the
server's details/usage, errors in-band or by status), served by a small in-process ASGI app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tgictl.runtime.bench.client import (
    ApiSettings,
    RequestRecord,
    auth_headers,
    request_body,
    send,
)
from tgictl.runtime.bench.workloads import BenchPrompt

PROMPT = BenchPrompt("hello there", (("system", "be brief"), ("user", "hello there")), 3, 2, group=1)


def test_request_bodies() -> None:
    tgi = request_body(ApiSettings("tgi", "m", ignore_eos=True), PROMPT)
    assert tgi == {"inputs": "hello there", "parameters": {"max_new_tokens": 3, "details": True, "ignore_eos": True}}
    chat = request_body(ApiSettings("openai-chat", "m", ignore_eos=False), PROMPT)
    assert chat["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    assert chat["stream_options"] == {"include_usage": True} and chat["temperature"] == 0.0
    assert "ignore_eos" not in chat and chat["max_tokens"] == 3 and chat["model"] == "m"
    completions = request_body(ApiSettings("openai-completions", "m", ignore_eos=True), PROMPT)
    assert completions["prompt"] == "hello there" and completions["ignore_eos"] is True
    assert auth_headers("k") == {"Authorization": "Bearer k"} and auth_headers(None) == {}


def _sse(events: list[Any]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        for event in events:
            text = event if isinstance(event, str) else json.dumps(event)
            yield f"data: {text}\n\n".encode()

    return StreamingResponse(body(), media_type="text/event-stream")


def _token(i: int) -> dict[str, Any]:
    return {"index": i, "token": {"id": i, "text": "x", "logprob": -1.0, "special": False},
            "generated_text": None, "details": None}


async def _tgi(request: Request) -> Response:
    body = await request.json()
    case = body["inputs"]
    if case == "bad":
        return JSONResponse({"error": "Input validation error", "error_type": "validation"}, status_code=422)
    if case == "cut":
        return _sse([_token(1)])
    if case == "in-band":
        return _sse([_token(1), {"error": "Request failed during generation", "error_type": "generation"}])
    last = _token(3) | {"generated_text": "xxx", "details": {"finish_reason": "length", "generated_tokens": 3,
                                                             "seed": None, "input_length": 7}}
    return _sse([_token(1), _token(2), last])


async def _completions(request: Request) -> Response:
    chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": None}], "usage": None}
    end = {"choices": [{"index": 0, "text": "y", "finish_reason": "length"}], "usage": None}
    usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}
    return _sse([chunk, chunk, chunk, end, usage, "[DONE]"])


async def _chat(request: Request) -> Response:
    """OpenAI's own shape: a role-only chunk first, then one chunk per token, then usage."""
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    token = {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
    if (await request.json())["messages"][0]["content"] == "no-done":
        # transformers serve: the finish reason on an empty delta with the usage, then the stream closes
        closing = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}
        return _sse([role, token, token, closing])
    end = {"choices": [{"index": 0, "delta": {"content": "y"}, "finish_reason": "stop"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}
    return _sse([role, token, token, end, usage, "[DONE]"])


APP = Starlette(routes=[Route("/generate_stream", _tgi, methods=["POST"]),
                        Route("/v1/completions", _completions, methods=["POST"]),
                        Route("/v1/chat/completions", _chat, methods=["POST"])])


def _send(api: str, text: str) -> RequestRecord:
    async def go() -> RequestRecord:
        transport = httpx.ASGITransport(app=APP)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            prompt = BenchPrompt(text, (("user", text),), 3, 2)
            return await send(client, ApiSettings(api, "m", True), prompt, 4, 0.0)

    return asyncio.run(go())


def test_tgi_stream_counts_come_from_details() -> None:
    record = _send("tgi", "ok")
    assert record.ok and record.status == 200 and record.index == 4
    assert (record.output_tokens, record.output_tokens_source, record.stream_events) == (3, "server", 3)
    assert (record.prompt_tokens, record.prompt_tokens_source, record.tokenizer_prompt_tokens) == (7, "server", 2)
    # httpx's ASGI transport hands the whole body over in one read: one burst of 3 tokens, no gap to measure.
    assert record.finish_reason == "length" and len(set(record.token_times)) == 1
    assert record.itl_s == [] and record.itl_burst_s == []
    assert record.ttft_s is not None and record.e2e_s is not None and 0 <= record.ttft_s <= record.e2e_s
    assert record.to_dict()["tpot_s"] == pytest.approx((record.e2e_s - record.ttft_s) / 2)


def test_openai_stream_counts_come_from_usage() -> None:
    record = _send("openai-completions", "ok")
    assert record.ok and record.stream_events == 4
    assert (record.output_tokens, record.prompt_tokens, record.finish_reason) == (4, 5, "length")


def test_chat_role_chunk_is_not_a_token() -> None:
    record = _send("openai-chat", "ok")
    assert record.ok and record.stream_events == 3 and len(record.token_times) == 3
    assert (record.output_tokens, record.prompt_tokens, record.finish_reason) == (3, 9, "stop")


def test_chat_stream_closed_after_its_finish_reason_is_complete() -> None:
    record = _send("openai-chat", "no-done")
    assert record.ok and record.stream_events == 2 and record.finish_reason == "length"
    assert (record.output_tokens, record.output_tokens_source) == (2, "server")


def test_extra_body_fields() -> None:
    settings = ApiSettings("openai-chat", "m", ignore_eos=False, extra_body={"logit_bias": {"2": -100.0}})
    body = request_body(settings, PROMPT)
    assert body["logit_bias"] == {"2": -100.0} and "ignore_eos" not in body


def test_failures_are_recorded() -> None:
    bad = _send("tgi", "bad")
    assert not bad.ok and bad.status == 422 and bad.error is not None and bad.error.startswith("HTTP 422:")
    cut = _send("tgi", "cut")
    assert cut.error == "the stream ended before its last event" and cut.output_tokens == 1
    in_band = _send("tgi", "in-band")
    assert in_band.error == "Request failed during generation"
