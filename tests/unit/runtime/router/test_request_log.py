"""The request log: one info line per finished generation with its id, route, tokens and times, never
its text; the client's X-Request-Id kept (and echoed) when it is a plain token; off with
--no-request-log. The router runs in-process on a fake shard (tgictl/testing/fake_shard.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from tgictl.config import RouterConfig
from tgictl.log import JsonLinesFormatter
from tgictl.runtime.router.http.app import create_app
from tgictl.runtime.router.request_log import request_id
from tgictl.runtime.router.service import RouterService
from tgictl.runtime.router.validation import GenerationInput
from tgictl.testing.fake_shard import FakeServiceClient

LOGGER = "tgictl.runtime.router.request_log"


def serve(tokenizer_dir: Path, body: Callable[[httpx.AsyncClient], Awaitable[None]], **config: object) -> None:
    async def scenario() -> None:
        settings = RouterConfig(master_shard_uds_path="/tmp/x-0", tokenizer_name="m", **config)  # type: ignore[arg-type]
        service = await RouterService.start(settings, tokenizer_dir, FakeServiceClient(), "tiny")
        try:
            transport = httpx.ASGITransport(app=create_app(service))
            async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
                await body(client)
        finally:
            await service.close()

    asyncio.run(scenario())


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def test_one_line_per_request_with_tgis_fields_and_no_text(
    tiny_tokenizer_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tgictl")
    answers: dict[str, httpx.Response] = {}

    async def body(client: httpx.AsyncClient) -> None:
        answers["tgi"] = await client.post("/generate", headers={"X-Request-Id": "job-42"},
                                           json={"inputs": "the quokka smiles", "parameters": {"max_new_tokens": 3}})
        answers["chat"] = await client.post("/v1/chat/completions", json={
            "model": "tgi", "messages": [{"role": "user", "content": "the quokka smiles"}], "max_tokens": 2, "n": 2})
        answers["tokenize"] = await client.post("/tokenize", json={"inputs": "the quokka smiles"})

    serve(tiny_tokenizer_dir, body)
    assert answers["tgi"].status_code == 200 and answers["tgi"].headers["x-request-id"] == "job-42"
    chat_id = answers["chat"].headers["x-request-id"]
    records = lines(caplog)
    assert [r.levelname for r in records] == ["INFO"] * 3  # /tokenize generates nothing
    first = records[0]
    assert first.request_id == "job-42" and first.route == "/generate" and first.adapter == "base"  # type: ignore[attr-defined]
    assert first.generated_tokens == 3 and first.finish_reason == "length"  # type: ignore[attr-defined]
    assert first.input_tokens == len(answers["tokenize"].json()) and first.cached_tokens == 0  # type: ignore[attr-defined]
    text = first.getMessage()
    assert text.startswith("request request_id=job-42 route=/generate adapter=base input_tokens=")
    for key in ("generated_tokens=3", "finish_reason=length", "total_time=", "validation_time=", "queue_time=",
                "inference_time=", "time_per_token="):
        assert key in text, key
    assert {r.request_id for r in records[1:]} == {f"{chat_id}/0", f"{chat_id}/1"}  # type: ignore[attr-defined]
    assert all(r.route == "/v1/chat/completions" and r.generated_tokens == 2 for r in records[1:])  # type: ignore[attr-defined]
    generated = answers["tgi"].json()["generated_text"]
    for record in records:
        message = record.getMessage()
        assert "quokka" not in message and generated not in message
    # --json-output: the same fields as keys, times in seconds.
    document = json.loads(JsonLinesFormatter().format(first))
    assert document["level"] == "info" and document["request_id"] == "job-42" and document["route"] == "/generate"
    assert document["generated_tokens"] == 3 and document["finish_reason"] == "length"
    assert 0 <= document["queue_time_s"] <= document["total_time_s"] and document["inference_time_s"] > 0


def test_a_client_that_leaves_is_logged_as_cancelled(tiny_tokenizer_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Straight on the service (no HTTP request around it: route `-`, an id of its own)."""
    caplog.set_level(logging.INFO, logger="tgictl")

    async def scenario() -> None:
        settings = RouterConfig(master_shard_uds_path="/tmp/x-0", tokenizer_name="m")
        service = await RouterService.start(settings, tiny_tokenizer_dir, FakeServiceClient(step_delay_s=0.005), "tiny")
        try:
            admission = service.admit()
            validated = await service.validate(admission, GenerationInput(inputs="hi", max_new_tokens=200))
            stream = service.stream(admission, validated)
            await anext(stream)
            await stream.aclose()  # the client is gone
            admission.release()
        finally:
            await service.close()

    asyncio.run(scenario())
    (record,) = lines(caplog)
    assert record.route == "-" and len(record.request_id) == 16 and record.finish_reason == "cancelled"  # type: ignore[attr-defined]
    assert "generated_tokens" not in record.getMessage() and "total_time=" in record.getMessage()


def test_no_request_log_turns_it_off(tiny_tokenizer_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tgictl")

    async def body(client: httpx.AsyncClient) -> None:
        answer = await client.post("/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": 2}})
        assert answer.status_code == 200 and answer.headers["x-request-id"]

    serve(tiny_tokenizer_dir, body, request_log=False)
    assert lines(caplog) == []


@pytest.mark.parametrize("sent", ["a b", "x" * 129, "", "line\nbreak", "quote\""])
def test_a_client_id_that_is_no_plain_token_is_replaced(sent: str) -> None:
    replaced = request_id(sent)
    assert replaced != sent and len(replaced) == 16 and replaced.isalnum()
    assert request_id("req-1:abc/2") == "req-1:abc/2"


def test_a_refused_request_is_logged_once_with_its_status(
    tiny_tokenizer_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tgictl")

    async def body(client: httpx.AsyncClient) -> None:
        bad = await client.post("/generate", headers={"X-Request-Id": "bad-1"},
                                json={"inputs": "the quokka", "parameters": {"max_new_tokens": -1}})
        assert bad.status_code == 422 and bad.headers["x-request-id"] == "bad-1"
        assert (await client.get("/health")).status_code == 200  # a success that generates nothing: no line

    serve(tiny_tokenizer_dir, body)
    (record,) = lines(caplog)
    assert record.request_id == "bad-1" and record.route == "/generate" and record.status == 422  # type: ignore[attr-defined]
    assert "quokka" not in record.getMessage() and "total_time=" in record.getMessage()
