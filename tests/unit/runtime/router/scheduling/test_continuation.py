"""Continuation rounds: one Entry, one stream across rounds; cancellation when the channel closes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tgictl.proto.messages import FinishReason, SamplingParams
from tgictl.runtime.router.kv.block_allocator import BlockAllocator
from tgictl.runtime.router.request import EndEvent, StreamEvent, TokenEvent, ValidatedRequest
from tgictl.runtime.router.scheduling.batcher import Batcher, BatcherConfig
from tgictl.runtime.router.scheduling.entry import TokenTexts
from tgictl.runtime.router.scheduling.event_channel import events
from tgictl.runtime.router.scheduling.queue import Queue
from tgictl.testing.fake_shard import FakeShard


@pytest.fixture(scope="module")
def texts(tiny_tokenizer_dir: Path) -> TokenTexts:
    tokenizer = Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    return TokenTexts(decoder=tokenizer, special_ids=frozenset())


def setup(texts: TokenTexts) -> tuple[FakeShard, BlockAllocator, Batcher]:
    allocator = BlockAllocator(num_blocks=64, block_size=4)
    shard = FakeShard(first_token=40, span=200)
    batcher = Batcher(shard, Queue(allocator, block_size=4), allocator, texts,
                      BatcherConfig(max_batch_prefill_tokens=64, max_batch_total_tokens=256))
    return shard, allocator, batcher


async def collect(batcher: Batcher, request: ValidatedRequest, per_round: int | None = None) -> list[StreamEvent]:
    task = asyncio.create_task(batcher.run())
    try:
        return [e async for e in events(batcher.submit([request], per_round))]
    finally:
        task.cancel()


def test_continuation_rounds_make_one_seamless_stream(texts: TokenTexts) -> None:
    shard, allocator, batcher = setup(texts)
    request = ValidatedRequest(input_ids=(5, 6, 7), sampling=SamplingParams(), max_new_tokens=3,
                               max_total_new_tokens=8)
    got = asyncio.run(collect(batcher, request, per_round=3))
    assert [type(e) for e in got] == [TokenEvent] * 7 + [EndEvent]
    end = got[-1]
    assert isinstance(end, EndEvent)
    assert end.generated_tokens == 8 and end.finish_reason == FinishReason.LENGTH
    assert end.input_length == 3
    # three rounds: request ids 0, 1, 2 produced 3 + 3 + 2 tokens
    ids = [e.token.id for e in got]
    assert ids == [shard.token(0, i) for i in range(3)] + [shard.token(1, i) for i in range(3)] + [
        shard.token(2, i) for i in range(2)
    ]
    assert end.generated_text == "".join(e.content for e in got)
    assert [c for c in shard.calls if c[0] == "prefill"] == [("prefill", (0,)), ("prefill", (1,)), ("prefill", (2,))]
    assert allocator.free_blocks == allocator.total_blocks


def test_closing_the_channel_cancels_the_request_and_frees_its_blocks(texts: TokenTexts) -> None:
    shard, allocator, batcher = setup(texts)

    async def scenario() -> None:
        task = asyncio.create_task(batcher.run())
        request = ValidatedRequest(input_ids=(5, 6, 7), sampling=SamplingParams(), max_new_tokens=40)
        stream = events(batcher.submit([request]))
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 2:
                break
        await stream.aclose()
        for _ in range(10):
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(scenario())
    assert batcher.in_flight == 0
    assert allocator.free_blocks == allocator.total_blocks
    assert shard.forwards < 10
