"""RouterService with a fake shard: start-up order, permits on every path, cancellation freeing
blocks, and the graceful drain. The HTTP app on top is exercised in-process for what needs no model."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from tgictl.testing.fake_shard import FakeServiceClient
from tgictl.config import RouterConfig, SchedulingPolicy
from tgictl.errors import OverloadedError, ValidationError
from tgictl.runtime.router.http.app import create_app
from tgictl.runtime.router.http.chat.turn import continue_final_message
from tgictl.runtime.router.request import EndEvent, ErrorEvent, StreamEvent, TokenEvent
from tgictl.runtime.router.service import RouterService, ShuttingDownError
from tgictl.runtime.router.validation import GenerationInput

T = TypeVar("T")


def run(
    tokenizer_dir: Path, body: Callable[[RouterService, FakeServiceClient], Awaitable[T]],
    fake: FakeServiceClient | None = None, **config: object,
) -> T:
    async def scenario() -> T:
        client = fake or FakeServiceClient()
        settings = RouterConfig(master_shard_uds_path="/tmp/x-0", tokenizer_name="m", **config)  # type: ignore[arg-type]
        service = await RouterService.start(settings, tokenizer_dir, client, "tiny")
        try:
            return await body(service, client)
        finally:
            await service.close()
            assert client.closed

    return asyncio.run(scenario())


async def events(stream: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    return [e async for e in stream]


def test_start_up_clears_then_warms_up(tiny_tokenizer_dir: Path) -> None:
    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        assert fake.shard.calls[0] == ("clear", ())  # ClearCache(None) before anything else
        (warmup,) = fake.warmups
        assert warmup.max_prefill_tokens == 512 and warmup.max_total_tokens == 300
        assert service.limits.max_total_tokens == 300 and service.limits.max_input_tokens == 299
        assert service.allocator.total_blocks == 4096 // 16 - 1  # block 0 is reserved

    run(tiny_tokenizer_dir, body, max_batch_prefill_tokens=512, max_total_tokens=300)


def test_warmup_says_what_it_does_and_how_long_it_lasts(
    tiny_tokenizer_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tgictl")

    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        pass

    run(tiny_tokenizer_dir, body, max_batch_prefill_tokens=512)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warmup: ")]
    assert "one prefill of 512 tokens" in line and "as long as one 512-token prompt's prefill" in line
    assert "docs/operations.md" in line


def test_permits_come_back_on_every_path(tiny_tokenizer_dir: Path) -> None:
    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        first = service.admit()
        with pytest.raises(OverloadedError):
            service.admit()
        with pytest.raises(ValidationError, match="`temperature` must be strictly positive"):
            await service.validate(first, GenerationInput(inputs="hi", temperature=0.0))
        first.release()
        first.release()  # idempotent
        assert service.in_flight == 0
        admission = service.admit()
        validated = await service.validate(admission, GenerationInput(inputs="hello", max_new_tokens=4))
        got = await events(service.stream(admission, validated))
        assert [type(e) for e in got] == [TokenEvent] * 3 + [EndEvent]
        admission.release()
        assert service.in_flight == 0
        text = service.metrics.render().decode()
        assert 'tgi_request_failure_total{err="overloaded"} 1.0' in text
        assert 'tgi_request_failure_total{err="validation"} 1.0' in text
        assert "tgi_request_success_total 1.0" in text

    run(tiny_tokenizer_dir, body, max_concurrent_requests=1)


def test_closing_a_stream_cancels_and_frees_blocks(tiny_tokenizer_dir: Path) -> None:
    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        total = service.allocator.total_blocks
        admission = service.admit()
        validated = await service.validate(admission, GenerationInput(inputs="hello there", max_new_tokens=200))
        stream = service.stream(admission, validated)
        assert isinstance(await anext(stream), TokenEvent)
        assert service.allocator.free_blocks + service.allocator.cached_blocks < total
        await stream.aclose()
        admission.release()
        for _ in range(100):
            if service.allocator.free_blocks + service.allocator.cached_blocks == total:
                break
            await asyncio.sleep(0.01)
        assert service.allocator.free_blocks + service.allocator.cached_blocks == total
        assert 'tgi_request_failure_total{err="dropped"} 1.0' in service.metrics.render().decode()

    run(tiny_tokenizer_dir, body, fake=FakeServiceClient(step_delay_s=0.005))


def test_drain_refuses_new_requests_and_ends_the_rest(tiny_tokenizer_dir: Path) -> None:
    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        admission = service.admit()
        validated = await service.validate(admission, GenerationInput(inputs="hello", max_new_tokens=500))
        consumer = asyncio.ensure_future(events(service.stream(admission, validated)))
        await asyncio.sleep(0.05)
        drained = asyncio.ensure_future(service.drain(timeout_s=0.1))
        await asyncio.sleep(0.01)
        with pytest.raises(ShuttingDownError):
            service.admit()
        with pytest.raises(ShuttingDownError):
            await service.check_health()
        got = await consumer
        admission.release()
        assert await drained is False
        assert isinstance(got[-1], ErrorEvent) and got[-1].error.error_type == "shutting_down"
        assert got[-1].error.http_status == 503

    run(tiny_tokenizer_dir, body, fake=FakeServiceClient(step_delay_s=0.01))


def test_drain_waits_for_requests_that_finish_in_time(tiny_tokenizer_dir: Path) -> None:
    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        admission = service.admit()
        validated = await service.validate(admission, GenerationInput(inputs="hello", max_new_tokens=5))

        async def consume() -> list[StreamEvent]:
            try:
                return await events(service.stream(admission, validated))
            finally:
                admission.release()

        consumer = asyncio.ensure_future(consume())
        assert await service.drain(timeout_s=5.0) is True
        assert isinstance((await consumer)[-1], EndEvent)

    run(tiny_tokenizer_dir, body, fake=FakeServiceClient(step_delay_s=0.005))


def test_app_errors_in_process(tiny_tokenizer_dir: Path) -> None:
    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        transport = httpx.ASGITransport(app=create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as http:
            ok = await http.post("/generate", json={"inputs": "hello", "parameters": {
                "max_new_tokens": 3, "decoder_input_details": False, "details": True}})
            assert ok.status_code == 200 and ok.json()["details"]["generated_tokens"] == 3
            fake.shard.fail_next.add("prefill")
            failed = await http.post("/generate", json={"inputs": "hello", "parameters": {"max_new_tokens": 3}})
            assert failed.status_code == 424
            assert failed.json() == {"error": "injected prefill failure", "error_type": "generation"}
            assert (await http.get("/health")).status_code == 200  # the probe forward succeeds
            assert len(fake.probes) == 1
            limited = await http.post("/generate", content=b"x" * 201, headers={"content-type": "application/json"})
            assert limited.status_code == 413
            wrong = await http.get("/generate")
            assert wrong.status_code == 405 and wrong.json()["error_type"] == "method_not_allowed"

    run(tiny_tokenizer_dir, body, payload_limit=200)


def test_continue_final_message() -> None:
    rendered = "<s>user: hi</s><s>assistant: Once upon</s><s>assistant:"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}]
    assert continue_final_message(rendered, messages) == "<s>user: hi</s><s>assistant: Once upon"
    assert continue_final_message(rendered, messages[:1]) == rendered


def test_in_stream_errors_as_tgi_and_openai_send_them(tiny_tokenizer_dir: Path) -> None:
    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        transport = httpx.ASGITransport(app=create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as http:
            fake.shard.fail_next.add("decode")
            tgi = await http.post("/generate_stream", json={"inputs": "hello", "parameters": {"max_new_tokens": 5}})
            assert tgi.status_code == 200
            frames = tgi.text.split("\n\n")
            assert frames[-1] == ""
            assert frames[-2] == 'data: {"error":"injected decode failure","error_type":"generation"}'
            assert frames[0].startswith('data: {"index":1,')  # the prefill's token came first
            fake.shard.fail_next.add("decode")
            chat = await http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True})
            frames = chat.text.split("\n\n")
            assert frames[-3:] == [
                'data: {"error":{"message":"injected decode failure","type":"server_error","param":null,'
                '"code":"generation"}}',
                "data: [DONE]", "",
            ]
        assert service.in_flight == 0

    run(tiny_tokenizer_dir, body)


def test_the_shard_chunks_with_the_routers_prefill_budget(tiny_tokenizer_dir: Path) -> None:
    """Warmup probes 2048 prefill tokens; the cache then holds 1024, so the router's derived budget
    shrinks to 1024, and that is what every Prefill tells the shard."""
    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        assert fake.warmups[0].max_prefill_tokens == 2048
        assert service.limits.max_batch_prefill_tokens == 1024
        admission = service.admit()
        validated = await service.validate(admission, GenerationInput(inputs="hello", max_new_tokens=2))
        await events(service.stream(admission, validated))
        admission.release()
        assert fake.shard.max_prefill_tokens == 1024

    run(tiny_tokenizer_dir, body, fake=FakeServiceClient(supported_tokens=1024))


def test_a_shard_that_cannot_chunk_is_refused(tiny_tokenizer_dir: Path) -> None:
    from tgictl.errors import UnhealthyError
    from tgictl.testing.fake_shard import fake_info

    with pytest.raises(UnhealthyError, match="does not support chunked prefill"):
        run(tiny_tokenizer_dir, lambda s, f: asyncio.sleep(0), fake=FakeServiceClient(info_reply=fake_info(chunking=False)))


def test_priority_on_both_apis_orders_the_queue_and_needs_the_priority_policy(tiny_tokenizer_dir: Path) -> None:
    """Under fcfs a priority other than 0 is refused in each API's error shape; under --scheduling-policy
    priority both APIs take it: with one request at a time, the later request of lower priority value runs
    before the earlier one, and /metrics shows who waits at which priority."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    async def fcfs(service: RouterService, fake: FakeServiceClient) -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(service)), base_url="http://r") as http:
            tgi = await http.post("/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": 2, "priority": 3}})
            assert tgi.status_code == 422 and tgi.json()["error_type"] == "validation"
            assert "--scheduling-policy priority" in tgi.json()["error"]
            openai = await http.post("/v1/chat/completions", json={**chat, "priority": 3})
            assert openai.status_code == 422 and openai.json()["error"]["type"] == "invalid_request_error"
            assert "--scheduling-policy priority" in openai.json()["error"]["message"]
            assert (await http.post("/v1/chat/completions", json={**chat, "priority": 0})).status_code == 200

    async def by_priority(service: RouterService, fake: FakeServiceClient) -> None:
        done: list[str] = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(service)), base_url="http://r") as http:
            async def send(name: str, path: str, body: dict[str, object]) -> None:
                assert (await http.post(path, json=body)).status_code == 200
                done.append(name)

            first = asyncio.create_task(send("running", "/generate", {"inputs": "hi", "parameters": {
                "max_new_tokens": 40, "priority": 5}}))
            while not service.batcher.in_flight:
                await asyncio.sleep(0.001)
            later = asyncio.create_task(send("openai, priority 3", "/v1/chat/completions", {**chat, "priority": 3}))
            while len(service.queue) < 1:
                await asyncio.sleep(0.001)
            urgent = asyncio.create_task(send("tgi, priority -1", "/generate", {"inputs": "hi", "parameters": {
                "max_new_tokens": 2, "priority": -1}}))
            while len(service.queue) < 2:
                await asyncio.sleep(0.001)
            metrics = (await http.get("/metrics")).text
            assert 'tgictl_queue_size_by_priority{priority="-1"} 1.0' in metrics
            assert 'tgictl_queue_size_by_priority{priority="3"} 1.0' in metrics
            assert "tgictl_request_preemptions_total 0.0" in metrics
            await asyncio.gather(first, later, urgent)
        assert done == ["running", "tgi, priority -1", "openai, priority 3"]

    run(tiny_tokenizer_dir, fcfs)
    run(tiny_tokenizer_dir, by_priority, fake=FakeServiceClient(step_delay_s=0.005), max_batch_size=1,
        scheduling_policy=SchedulingPolicy.PRIORITY)
