"""Continuation rounds: one Entry, one stream across rounds; cancellation when the channel closes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tgictl.proto.messages import FinishReason, Grammar, GrammarType, SamplingParams
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
    shard = FakeShard(first_token=40, span=200, block_size=4)
    batcher = Batcher(shard, Queue(allocator, block_size=4), allocator, texts,
                      BatcherConfig(max_batch_prefill_tokens=64))
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


def run_script(texts: TokenTexts, script: tuple[int, ...], per_round: int, radix: bool = False,
               **fields: object) -> tuple[list[StreamEvent], FakeShard, object]:
    """One request of prompt (5, 6, 7) whose shard output is `script`, in rounds of `per_round`."""
    from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator

    allocator = (RadixAllocator if radix else BlockAllocator)(num_blocks=256, block_size=4)
    shard = FakeShard(first_token=40, span=200, block_size=4, script=script, script_prompt_len=3)
    batcher = Batcher(shard, Queue(allocator, block_size=4), allocator, texts,
                      BatcherConfig(max_batch_prefill_tokens=2048))
    request = ValidatedRequest(input_ids=(5, 6, 7), sampling=fields.pop("sampling", SamplingParams()),  # type: ignore[arg-type]
                               max_new_tokens=per_round, max_total_new_tokens=len(script), **fields)  # type: ignore[arg-type]
    got = asyncio.run(collect(batcher, request, per_round=per_round))
    return got, shard, allocator


def text_ids(texts: TokenTexts, text: str) -> tuple[int, ...]:
    return tuple(texts.decoder.encode(text, add_special_tokens=False).ids)  # type: ignore[attr-defined]


def test_a_character_split_at_a_round_boundary_stays_whole(texts: TokenTexts) -> None:
    ids = text_ids(texts, "a中b")
    pieces = [texts.decoder.decode([i], skip_special_tokens=False) for i in ids]
    cut = next(i for i, p in enumerate(pieces) if "\ufffd" in p)  # the first id that is part of 中
    got, _, _ = run_script(texts, ids, per_round=cut + 1)  # the round ends inside the character
    end = got[-1]
    assert isinstance(end, EndEvent) and end.generated_text == "a中b"
    assert "".join(e.content for e in got) == "a中b"


def test_a_stop_string_spanning_a_round_boundary_matches(texts: TokenTexts) -> None:
    ids = text_ids(texts, "xx STOP yy")
    got, _, _ = run_script(texts, ids, per_round=3, stop_sequences=("STOP",))
    end = got[-1]
    assert isinstance(end, EndEvent) and end.finish_reason == FinishReason.STOP_SEQUENCE
    assert end.generated_text == "xx " and end.stop_sequence == "STOP"


def test_details_of_a_continued_request_cover_every_round(texts: TokenTexts) -> None:
    ids = tuple(40 + i for i in range(10))
    got, shard, _ = run_script(texts, ids, per_round=4, sampling=SamplingParams(do_sample=True, seed=42))
    end = got[-1]
    assert isinstance(end, EndEvent)
    assert end.seed == 42  # the request's seed, not a round's
    assert end.generated_tokens == 10 and [e.token.id for e in got] == list(ids)
    assert [c for c in shard.calls if c[0] == "prefill"] == [("prefill", (0,)), ("prefill", (1,)), ("prefill", (2,))]


def test_a_round_publishes_its_output_so_the_next_round_needs_no_prefill(texts: TokenTexts) -> None:
    ids = tuple(40 + i for i in range(30))

    got, shard, allocator = run_script(texts, ids, per_round=13, radix=True)
    assert isinstance(got[-1], EndEvent) and got[-1].generated_tokens == 30
    # Round 2's prompt is 3 + 13 = 16 tokens, of which 3 + 12 = 15 were computed in round 1: 3 full
    # blocks of 4 come from the cache. Round 3: 3 + 26 = 29, 28 computed: 7 blocks.
    prefills = [call for call in shard.calls if call[0] == "prefill"]
    assert len(prefills) == 3
    assert shard.cache_lens == [0, 12, 28]
    allocator.check_integrity()  # type: ignore[attr-defined]


def test_a_constrained_request_replays_its_output_in_later_rounds(texts: TokenTexts) -> None:
    shard, _, batcher = setup(texts)
    grammar = Grammar(GrammarType.REGEX, ".*")
    request = ValidatedRequest(input_ids=(5, 6, 7), sampling=SamplingParams(grammar=grammar), max_new_tokens=3,
                               max_total_new_tokens=8)
    sent: list[tuple[int, int]] = []
    prefill = shard.prefill

    async def recording(batch, cached, *rest):  # noqa: ANN001, ANN002, ANN202
        sent.extend((len(r.input_ids), r.sampling.grammar.replay_tokens) for r in batch.requests)
        return await prefill(batch, cached, *rest)

    shard.prefill = recording  # type: ignore[method-assign]
    got = asyncio.run(collect(batcher, request, per_round=3))
    assert isinstance(got[-1], EndEvent)
    # Each round's prompt is the original plus what was generated, and the shard replays exactly that.
    assert sent == [(3, 0), (6, 3), (9, 6)]
