"""The batching loop against a fake shard client: routing, stopping, filtering, errors, leaks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tgictl.proto.messages import FinishReason, SamplingParams
from tgictl.runtime.router.kv.block_allocator import BlockAllocator
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator
from tgictl.runtime.router.request import (
    EndEvent,
    ErrorEvent,
    StreamEvent,
    TokenEvent,
    ValidatedRequest,
)
from tgictl.runtime.router.scheduling.batcher import Batcher, BatcherConfig
from tgictl.runtime.router.scheduling.entry import Entry, TokenTexts
from tgictl.runtime.router.scheduling.queue import Queue
from tgictl.testing.fake_shard import FakeShard


@pytest.fixture(scope="module")
def texts(tiny_tokenizer_dir: Path) -> TokenTexts:
    tokenizer = Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    special = frozenset(i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special)
    return TokenTexts(decoder=tokenizer, special_ids=special)


class Client:
    """One request's side of the stream."""

    def __init__(self, request: ValidatedRequest, cancel_after: int | None = None) -> None:
        self.events: list[StreamEvent] = []
        self.done = asyncio.Event()
        self.cancelled = False
        self.cancel_after = cancel_after
        self.entry = Entry(request=request, send=self._send, is_cancelled=lambda: self.cancelled)

    def _send(self, event: StreamEvent) -> None:
        assert not self.done.is_set(), "event after the end of the stream"
        self.events.append(event)
        if isinstance(event, (EndEvent, ErrorEvent)):
            self.done.set()
        elif self.cancel_after is not None and len(self.events) >= self.cancel_after:
            self.cancelled = True
            self.done.set()


def request(prompt: tuple[int, ...] = (5, 6, 7), max_new_tokens: int = 4, **kw: object) -> ValidatedRequest:
    return ValidatedRequest(input_ids=prompt, sampling=SamplingParams(), max_new_tokens=max_new_tokens, **kw)  # type: ignore[arg-type]


def make(
    texts: TokenTexts,
    *,
    num_blocks: int = 256,
    block_size: int = 4,
    radix: bool = False,
    **config: object,
) -> tuple[Batcher, FakeShard, BlockAllocator | RadixAllocator, Queue]:
    allocator = (RadixAllocator if radix else BlockAllocator)(num_blocks=num_blocks, block_size=block_size)
    queue = Queue(allocator, block_size=block_size)
    shard = FakeShard(first_token=40, span=200, block_size=block_size)
    settings = dict(max_batch_prefill_tokens=64)
    settings.update(config)
    batcher = Batcher(shard, queue, allocator, texts, BatcherConfig(**settings))  # type: ignore[arg-type]
    return batcher, shard, allocator, queue


async def serve(batcher: Batcher, clients: list[Client], stagger: Callable[[int], float] = lambda i: 0.0,
                one_by_one: bool = False) -> None:
    """Enqueue the clients (after `stagger(i)` seconds each; with `one_by_one`, each once the one before it
    has its first event, so every one joins a running batch however fast the fake shard steps) and wait
    for all of them."""
    task = asyncio.create_task(batcher.run())
    try:
        for i, client in enumerate(clients):
            if stagger(i):
                await asyncio.sleep(stagger(i))
            if one_by_one and i > 0:
                while not clients[i - 1].events:
                    await asyncio.sleep(0)
            batcher.enqueue(client.entry)
        await asyncio.wait_for(asyncio.gather(*(c.done.wait() for c in clients)), timeout=10)
        for _ in range(5):  # let the loop reach its next step (filtering of cancelled requests)
            batcher.notify()
            await asyncio.sleep(0.01)
    finally:
        task.cancel()


def tokens_of(client: Client) -> list[int]:
    return [e.token.id for e in client.events if isinstance(e, (TokenEvent, EndEvent))]


def assert_no_leak(allocator: BlockAllocator | RadixAllocator) -> None:
    allocator.check_integrity()
    assert allocator.free_blocks + allocator.cached_blocks == allocator.total_blocks


def test_requests_of_mixed_lengths_all_finish_with_their_own_tokens(texts: TokenTexts) -> None:
    batcher, shard, allocator, _ = make(texts)
    clients = [Client(request(max_new_tokens=n)) for n in (1, 5, 3, 8)]
    asyncio.run(serve(batcher, clients, stagger=lambda i: 0.001 * i))
    for rid, (client, n) in enumerate(zip(clients, (1, 5, 3, 8))):
        end = client.events[-1]
        assert isinstance(end, EndEvent)
        assert end.finish_reason == FinishReason.LENGTH and end.generated_tokens == n
        assert tokens_of(client) == [shard.token(rid, i) for i in range(n)]
        assert end.generated_text == "".join(e.content for e in client.events if isinstance(e, (TokenEvent, EndEvent)))
    assert batcher.in_flight == 0
    assert_no_leak(allocator)


def test_a_stop_string_ends_the_request_and_filters_it_out(texts: TokenTexts) -> None:
    batcher, shard, allocator, _ = make(texts)
    probe = Client(request(max_new_tokens=6))
    asyncio.run(serve(batcher, [probe]))
    third = texts.decoder.decode([shard.token(0, 2)], skip_special_tokens=False)

    batcher, shard, allocator, _ = make(texts)
    stopping = Client(request(max_new_tokens=6, stop_sequences=(third,)))
    other = Client(request(max_new_tokens=6))
    asyncio.run(serve(batcher, [stopping, other]))
    end = stopping.events[-1]
    assert isinstance(end, EndEvent) and end.finish_reason == FinishReason.STOP_SEQUENCE
    assert end.stop_sequence == third and end.generated_tokens == 3
    assert not end.generated_text.endswith(third)
    assert ("filter", (1,)) in shard.calls
    assert isinstance(other.events[-1], EndEvent) and other.events[-1].generated_tokens == 6
    assert_no_leak(allocator)


def test_decode_steps_per_call_give_every_client_the_same_stream(texts: TokenTexts) -> None:
    """Several steps per Decode (BatcherConfig.decode_steps): the same tokens, texts and stop-string end as one
    step per call, in fewer calls; a stop string inside a call's tokens drops the rest and filters the row."""
    streams = {}
    for steps in (1, 3):
        batcher, shard, allocator, _ = make(texts, decode_steps=steps)
        third = texts.decoder.decode([shard.token(0, 2)], skip_special_tokens=False)
        clients = [Client(request(max_new_tokens=8, stop_sequences=(third,))), Client(request(max_new_tokens=8))]
        asyncio.run(serve(batcher, clients))
        streams[steps] = [[(e.token.id, e.content) for e in c.events if isinstance(e, (TokenEvent, EndEvent))]
                          for c in clients]
        ends = [c.events[-1] for c in clients]
        assert isinstance(ends[0], EndEvent) and ends[0].finish_reason == FinishReason.STOP_SEQUENCE
        assert isinstance(ends[1], EndEvent) and ends[1].generated_tokens == 8
        assert set(shard.decode_steps) == {steps}
        assert ("filter", (1,)) in shard.calls
        assert_no_leak(allocator)
        calls = len(shard.decode_steps)
        assert calls == (7 if steps == 1 else 3)  # 8 tokens: 1 from the prefill, then 7 steps
    assert streams[3] == streams[1]


@pytest.mark.parametrize(("step_ms", "decode_steps", "expected"), [
    (3.0, 4, 10),   # short steps: as many as make a 30 ms call
    (0.5, 4, 16),   # very short ones: at most MAX_ADAPTIVE_DECODE_STEPS
    (12.0, 4, 4),   # long ones: never fewer than --decode-steps
    (0.5, 1, 1),    # --decode-steps 1: always one step per call, as TGI
])
def test_short_steps_get_more_of_them_per_call(texts: TokenTexts, step_ms: float, decode_steps: int,
                                               expected: int) -> None:
    batcher, shard, allocator, _ = make(texts, decode_steps=decode_steps, decode_call_ns=30_000_000)
    shard.step_forward_ns = round(step_ms * 1e6)
    client = Client(request(max_new_tokens=60))
    asyncio.run(serve(batcher, [client]))
    assert len(tokens_of(client)) == 60
    # the first call knows no step time yet; the next ones ask for what fits (the last one stops early)
    assert shard.decode_steps[0] == decode_steps and set(shard.decode_steps[1:]) == {expected}
    assert_no_leak(allocator)


def test_one_step_per_call_while_a_request_waits(texts: TokenTexts) -> None:
    # One request per batch (max_batch_size), so the second waits in the queue while the first runs.
    batcher, shard, allocator, queue = make(texts, decode_steps=4, max_batch_size=1)
    first, second = Client(request(max_new_tokens=18)), Client(request(max_new_tokens=18))
    asyncio.run(serve(batcher, [first, second]))
    assert tokens_of(first) == [shard.token(0, i) for i in range(18)] and len(tokens_of(second)) == 18
    # the first ran alone with the second queued: one step per call; then the second alone: four per call
    # (17 tokens after its prefill's: 4 + 4 + 4 + 4 + 1)
    assert shard.decode_steps == [1] * 17 + [4] * 5
    assert_no_leak(allocator)


def test_a_client_that_leaves_is_filtered_and_its_blocks_freed(texts: TokenTexts) -> None:
    batcher, shard, allocator, _ = make(texts)
    leaving = Client(request(max_new_tokens=50), cancel_after=2)
    staying = Client(request(max_new_tokens=10))
    asyncio.run(serve(batcher, [leaving, staying]))
    assert len(leaving.events) == 2
    assert ("filter", (1,)) in shard.calls
    assert isinstance(staying.events[-1], EndEvent)
    assert_no_leak(allocator)


def test_a_failed_decode_fails_its_requests_and_the_loop_goes_on(texts: TokenTexts) -> None:
    batcher, shard, allocator, queue = make(texts)
    shard.fail_next.add("decode")
    first = [Client(request(max_new_tokens=5)) for _ in range(2)]

    async def scenario() -> Client:
        await serve(batcher, first)
        later = Client(request(max_new_tokens=3))
        await serve(batcher, [later])
        return later

    later = asyncio.run(scenario())
    for client in first:
        assert isinstance(client.events[-1], ErrorEvent)
        assert client.events[-1].error.error_type == "generation"
    assert isinstance(later.events[-1], EndEvent) and later.events[-1].generated_tokens == 3
    assert any(call[0] == "clear" for call in shard.calls)
    assert_no_leak(allocator)


@pytest.mark.parametrize("decode_steps", [1, 4])
def test_a_request_the_shard_ends_alone_fails_alone(texts: TokenTexts, decode_steps: int) -> None:
    """Generation.error (a grammar that failed on the shard): that request gets a 422 error event after the
    tokens it had; its neighbours finish with all their tokens; nothing is cleared and nothing leaks."""
    batcher, shard, allocator, _ = make(texts, decode_steps=decode_steps)
    shard.fail_requests = {1: 2}  # the second request fails after two tokens
    clients = [Client(request(max_new_tokens=6)) for _ in range(3)]
    asyncio.run(serve(batcher, clients))
    failed = clients[1]
    assert len(tokens_of(failed)) == 2 and isinstance(failed.events[-1], ErrorEvent)
    assert failed.events[-1].error.http_status == 422 and "request 1 failed alone" in failed.events[-1].error.message
    for client in (clients[0], clients[2]):
        assert isinstance(client.events[-1], EndEvent) and client.events[-1].generated_tokens == 6
    assert not any(call[0] == "clear" for call in shard.calls)
    assert_no_leak(allocator)


def test_a_long_prompt_is_chunked_and_yields_nothing_until_it_is_whole(texts: TokenTexts) -> None:
    batcher, shard, allocator, _ = make(texts, max_batch_prefill_tokens=16)
    long_prompt = tuple(range(100, 150))  # 50 tokens, budget 16 per step
    client = Client(request(prompt=long_prompt, max_new_tokens=2))
    asyncio.run(serve(batcher, [client]))
    assert [type(e) for e in client.events] == [TokenEvent, EndEvent]
    assert shard.calls[0] == ("prefill", (0,))
    # Every chunk within the budget of 16, later ones too (as the real shard sizes them): 16 + 16 + 16
    # + 2 prompt tokens, the last of these forwards yielding the first token, then the second token.
    assert shard.forwards == 5
    assert shard.max_prefill_tokens == 16  # the router told the shard its budget
    assert_no_leak(allocator)


def test_computed_prompts_are_published_to_the_prefix_cache(texts: TokenTexts) -> None:
    batcher, shard, allocator, _ = make(texts, radix=True)
    prompt = tuple(range(60, 80))  # five blocks of 4
    asyncio.run(serve(batcher, [Client(request(prompt=prompt, max_new_tokens=2))]))
    assert allocator.cached_blocks == 5
    assert_no_leak(allocator)


def test_failed_prefill_publishes_nothing(texts: TokenTexts) -> None:
    batcher, shard, allocator, _ = make(texts, radix=True)
    shard.fail_next.add("prefill")
    client = Client(request(prompt=tuple(range(60, 80)), max_new_tokens=2))
    asyncio.run(serve(batcher, [client]))
    assert isinstance(client.events[-1], ErrorEvent)
    assert allocator.cached_blocks == 0
    assert_no_leak(allocator)


def test_many_concurrent_requests_leave_nothing_behind(texts: TokenTexts) -> None:
    batcher, shard, allocator, queue = make(texts, num_blocks=40, block_size=4, radix=True,
                                            max_batch_prefill_tokens=24)
    clients = [
        Client(request(prompt=tuple(range(10, 10 + 3 + i % 7)), max_new_tokens=1 + i % 9),
               cancel_after=(3 if i % 5 == 0 else None))
        for i in range(32)
    ]
    asyncio.run(serve(batcher, clients, stagger=lambda i: 0.0005 * (i % 3)))
    assert len(queue) == 0 and batcher.in_flight == 0
    assert_no_leak(allocator)


def test_an_unexpected_client_exception_fails_only_that_step(texts: TokenTexts) -> None:
    batcher, shard, allocator, _ = make(texts)
    broken = {"armed": True}
    original = shard.prefill

    async def prefill(batch, cached, max_prefill_tokens=None, grants=()):  # type: ignore[no-untyped-def]
        if broken["armed"] and any(r.input_ids == (9, 9, 9) for r in batch.requests):
            broken["armed"] = False
            raise ValueError("Value out of range: 4294967296")  # what protobuf raises for a bad field
        return await original(batch, cached, max_prefill_tokens, grants)

    shard.prefill = prefill  # type: ignore[method-assign]

    async def scenario() -> tuple[Client, Client]:
        running = Client(request(max_new_tokens=30))
        task = asyncio.create_task(batcher.run())
        batcher.enqueue(running.entry)
        await asyncio.sleep(0.01)
        bad = Client(request(prompt=(9, 9, 9), max_new_tokens=3))
        batcher.enqueue(bad.entry)
        await asyncio.wait_for(asyncio.gather(running.done.wait(), bad.done.wait()), timeout=10)
        task.cancel()
        return running, bad

    running, bad = asyncio.run(scenario())
    assert isinstance(bad.events[-1], ErrorEvent)
    assert "ValueError" in str(bad.events[-1].error)
    # (with chunking the new batch shares its step with the running one, which fails with it)
    later = Client(request(max_new_tokens=2))
    asyncio.run(serve(batcher, [later]))
    assert isinstance(later.events[-1], EndEvent)
    assert_no_leak(allocator)


def test_a_request_that_can_never_fit_fails_instead_of_wedging_the_queue(texts: TokenTexts) -> None:
    """5 blocks of 1 token, 4 usable: a request needing 6 slots can never be allocated, even in an empty
    cache. It fails at once; the request behind it runs."""
    batcher, shard, allocator, queue = make(texts, num_blocks=5, block_size=1)
    too_big = Client(request(prompt=(5, 6, 7), max_new_tokens=4))  # 3 + 4 - 1 = 6 slots
    fits = Client(request(prompt=(5, 6), max_new_tokens=2))
    asyncio.run(serve(batcher, [too_big, fits]))
    assert isinstance(too_big.events[-1], ErrorEvent)
    assert "needs 6 KV slots" in str(too_big.events[-1].error) and too_big.events[-1].error.http_status == 422
    assert isinstance(fits.events[-1], EndEvent)
    assert len(queue) == 0
    assert_no_leak(allocator)


def test_requests_sharing_a_cached_prefix_run_together_in_a_cache_that_holds_it_once(texts: TokenTexts) -> None:
    """The allocator is the budget. A 2,048-token prefix cached once (128 blocks of 16) in an 8,192-token
    cache, then 16 requests arriving one by one, each adding 2 prompt tokens and generating 100 (7 blocks
    of their own): 128 + 16 * 7 = 240 of 511 usable blocks. Subtracting every running row's whole
    allocation (135 blocks, prefix included) from 8,192 tokens made the budget negative at 4 rows."""
    batcher, shard, allocator, _ = make(texts, num_blocks=512, block_size=16, radix=True, max_batch_prefill_tokens=4096)
    prefix = tuple(100 + i % 300 for i in range(2048))
    clients = [Client(request(prompt=prefix + (2, 3 + i), max_new_tokens=100)) for i in range(16)]

    async def scenario() -> None:
        await serve(batcher, [Client(request(prompt=prefix + (1,), max_new_tokens=1))])  # publishes it
        shard.peak_batch_size = 0
        await serve(batcher, clients, one_by_one=True)

    asyncio.run(scenario())
    assert all(isinstance(c.events[-1], EndEvent) and c.events[-1].generated_tokens == 100 for c in clients)
    assert shard.peak_batch_size == 16
    assert_no_leak(allocator)


def test_a_stop_string_that_is_a_special_token_matches(texts: TokenTexts) -> None:
    """`<|im_end|>` as a stop string: special tokens produce no visible text, but stop strings are
    matched on the text with special tokens, as TGI does; the content still never shows them."""
    tokenizer = texts.decoder
    im_end = tokenizer.token_to_id("<|im_end|>")  # type: ignore[attr-defined]
    assert im_end in texts.special_ids
    hi = tuple(tokenizer.encode("hi there", add_special_tokens=False).ids)  # type: ignore[attr-defined]
    batcher, shard, allocator, _ = make(texts)
    shard.script, shard.script_prompt_len = hi + (im_end,) + hi, 3
    client = Client(request(max_new_tokens=len(hi) * 2 + 1, stop_sequences=("<|im_end|>",)))
    asyncio.run(serve(batcher, [client]))
    end = client.events[-1]
    assert isinstance(end, EndEvent) and end.finish_reason == FinishReason.STOP_SEQUENCE
    assert end.stop_sequence == "<|im_end|>" and end.generated_text == "hi there"
    assert end.generated_tokens == len(hi) + 1
    assert "".join(e.content for e in client.events if isinstance(e, (TokenEvent, EndEvent))) == "hi there"
    assert_no_leak(allocator)
