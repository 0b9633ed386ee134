"""Router core against a real shard process: the batcher, queue, radix allocator and
ShardedClient scheduling real forwards, without the HTTP layer."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from shard_procs import BLOCK_SIZE, REPO_ROOT, ShardProc, start_shard, warmup_batch
from tokenizers import Tokenizer

from tests.integration.test_http_tgi import greedy as greedy_oracle
from tgictl.config import SchedulingPolicy
from tgictl.proto.messages import (
    Batch,
    BlockGrant,
    CachedBatch,
    SamplingParams,
    StepResult,
    WarmupRequest,
)
from tgictl.kv_groups import KvGroups, hybrid_window
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator
from tgictl.runtime.router.request import (
    EndEvent,
    ErrorEvent,
    StreamEvent,
    TokenEvent,
    ValidatedRequest,
)
from tgictl.runtime.router.scheduling.batcher import Batcher, BatcherConfig
from tgictl.runtime.router.scheduling.queue import Queue
from tgictl.runtime.router.scheduling.entry import TokenTexts
from tgictl.runtime.router.scheduling.event_channel import events
from tgictl.runtime.router.shard_client import ShardedClient
from tgictl.testing.tiny_models import window_options


def serve(model_dir: Path, base: Path) -> Iterator[ShardProc]:
    """A shard process on `model_dir` for the module's tests, killed after them."""
    proc = start_shard(model_dir, base / "s", base / "shard.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def shard(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardProc]:
    yield from serve(tiny_model_dir, tmp_path_factory.mktemp("router-core"))


class RecordingClient:
    """The real ShardedClient, recording the batches the router sends (what the shard is told)."""

    def __init__(self, inner: ShardedClient) -> None:
        self.inner = inner
        self.prefills: list[Batch] = []
        self.grants = 0  # BlockGrants sent: blocks handed to running requests as they grew
        self.allocator: RadixAllocator | None = None  # when set, its used blocks at every Decode
        self.used_blocks: list[int] = []
        self.local_used_blocks: list[int] = []  # with two layer groups: the local group's used blocks

    async def prefill(
        self, batch: Batch, cached: CachedBatch | None, max_prefill_tokens: int | None = None,
        grants: Sequence[BlockGrant] = (),
    ) -> StepResult:
        self.prefills.append(batch)
        self.grants += len(grants)
        return await self.inner.prefill(batch, cached, max_prefill_tokens, grants)

    async def decode(
        self, batches: Sequence[CachedBatch], steps: int = 1, grants: Sequence[BlockGrant] = ()
    ) -> StepResult:
        self.grants += len(grants)
        allocator = self.allocator
        if allocator is not None:
            self.used_blocks.append(allocator.used_blocks)
            if allocator.groups is not None and allocator.local_free_blocks is not None:
                self.local_used_blocks.append(allocator.groups.local_blocks - 1 - allocator.local_free_blocks)
        return await self.inner.decode(batches, steps, grants)

    async def filter_batch(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch:
        return await self.inner.filter_batch(batch_id, request_ids)

    async def clear_cache(self, batch_id: int | None) -> None:
        await self.inner.clear_cache(batch_id)


@dataclass
class Stack:
    client: RecordingClient
    allocator: RadixAllocator
    batcher: Batcher

    def no_leak(self) -> None:
        self.allocator.check_integrity()
        assert self.allocator.free_blocks + self.allocator.cached_blocks == self.allocator.total_blocks


async def make_stack(
    socket_path: Path, tokenizer_dir: Path, prefill_tokens: int = 512, num_blocks: int = 512, decode_steps: int = 1,
    policy: SchedulingPolicy = SchedulingPolicy.FCFS, release_window: int | None = None,
    local_blocks: int | None = None,
) -> Stack:
    """`num_blocks`: the router's KV budget (at most what the shard holds), reserved block 0 included; with two
    layer groups (the shard says so at warmup) `local_blocks` caps the local group's likewise."""
    inner = await ShardedClient.connect(str(socket_path))
    await inner.clear_cache(None)
    warm = await inner.warmup(WarmupRequest(batch=warmup_batch(), max_prefill_tokens=prefill_tokens))
    num_blocks = min(warm.max_supported_total_tokens // BLOCK_SIZE, num_blocks)
    groups = None
    if warm.local_blocks:
        window = hybrid_window((await inner.info()).layer_windows)
        assert window is not None
        groups = KvGroups(warm.max_supported_total_tokens // BLOCK_SIZE,
                          min(warm.local_blocks, local_blocks or warm.local_blocks), window)
    allocator = RadixAllocator(num_blocks=num_blocks, block_size=BLOCK_SIZE, groups=groups)
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    texts = TokenTexts(tokenizer, frozenset())
    client = RecordingClient(inner)
    batcher = Batcher(
        client, Queue(allocator, block_size=BLOCK_SIZE, policy=policy), allocator, texts,
        BatcherConfig(max_batch_prefill_tokens=prefill_tokens, decode_steps=decode_steps,
                      release_window=release_window),
    )
    client.allocator = allocator
    return Stack(client, allocator, batcher)


def greedy(prompt: tuple[int, ...], n: int) -> ValidatedRequest:
    return ValidatedRequest(input_ids=prompt, sampling=SamplingParams(), max_new_tokens=n, ignore_eos=True)


async def tokens(stack: Stack, request: ValidatedRequest) -> list[int]:
    got: list[StreamEvent] = [e async for e in events(stack.batcher.submit([request]))]
    assert isinstance(got[-1], EndEvent), got[-1]
    return [e.token.id for e in got if isinstance(e, (TokenEvent, EndEvent))]


def run(shard: ShardProc, tiny_model_dir: Path, scenario, **kw: int):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        stack = await make_stack(shard.socket_path, tiny_model_dir, **kw)
        task = asyncio.create_task(stack.batcher.run())
        try:
            return await asyncio.wait_for(scenario(stack), timeout=120)
        finally:
            task.cancel()
            await stack.client.inner.close()

    return asyncio.run(main())


def prompts(count: int) -> list[tuple[int, ...]]:
    return [tuple(5 + (i * 7 + j * 3) % 400 for j in range(3 + (i * 5) % 29)) for i in range(count)]


def test_32_concurrent_requests_equal_each_alone(shard: ShardProc, tiny_model_dir: Path) -> None:
    requests = [greedy(p, 1 + (i * 3) % 12) for i, p in enumerate(prompts(32))]

    async def scenario(stack: Stack) -> tuple[list[list[int]], list[list[int]]]:
        alone = [await tokens(stack, r) for r in requests]
        together = await asyncio.gather(*(tokens(stack, r) for r in requests))
        stack.no_leak()
        return alone, list(together)

    alone, together = run(shard, tiny_model_dir, scenario)
    assert together == alone
    assert [len(t) for t in alone] == [r.max_new_tokens for r in requests]


def test_a_shared_prefix_is_computed_once(shard: ShardProc, tiny_model_dir: Path) -> None:
    prefix = tuple(10 + (i * 11) % 300 for i in range(200))
    first, second = prefix + (7, 8, 9), prefix + (40, 41)

    async def scenario(stack: Stack) -> tuple[list[int], list[int], list[int]]:
        cold = await tokens(stack, greedy(second, 6))  # computes the prefix, publishes 12 blocks
        await tokens(stack, greedy(first, 4))
        warm = await tokens(stack, greedy(second, 6))
        stack.no_leak()
        return cold, warm, [r.requests[0].cache_len for r in stack.client.prefills]

    cold, warm, cache_lens = run(shard, tiny_model_dir, scenario)
    assert cache_lens == [0, 192, 192]  # 200 // 16 full blocks reused: only the suffix is computed
    assert warm == cold


def test_a_prompt_longer_than_the_prefill_budget_is_chunked(shard: ShardProc, tiny_model_dir: Path) -> None:
    long_prompt = tuple(20 + (i * 13) % 350 for i in range(150))

    async def scenario(stack: Stack) -> tuple[list[int], list[int | None]]:
        out = await tokens(stack, greedy(long_prompt, 5))
        stack.no_leak()
        return out, [r.requests[0].chunk_len for r in stack.client.prefills]

    chunked, chunk_lens = run(shard, tiny_model_dir, scenario, prefill_tokens=64)
    whole, _ = run(shard, tiny_model_dir, scenario, prefill_tokens=512)
    assert chunk_lens == [64]
    assert chunked == whole


def test_a_client_that_leaves_mid_generation_frees_its_blocks(shard: ShardProc, tiny_model_dir: Path) -> None:
    async def scenario(stack: Stack) -> int:
        stream = events(stack.batcher.submit([greedy(prompts(1)[0], 200)]))
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 3:
                break
        await stream.aclose()
        before = stack.allocator.used_blocks
        other = await tokens(stack, greedy(prompts(2)[1], 3))  # the next steps filter the leaver out
        assert len(other) == 3 and stack.batcher.in_flight == 0
        stack.no_leak()
        return before

    assert run(shard, tiny_model_dir, scenario) > 0


def sampled(prompt: tuple[int, ...], n: int, seed: int) -> ValidatedRequest:
    return ValidatedRequest(input_ids=prompt, sampling=SamplingParams(temperature=0.8, top_k=50, seed=seed),
                            max_new_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("decode_steps", [1, 4])
def test_preempted_requests_resume_to_the_outputs_they_have_alone(
    shard: ShardProc, tiny_model_dir: Path, decode_steps: int
) -> None:
    """A KV budget of 24 blocks (23 usable, 368 tokens) and 8 requests of up to 30 + 60 tokens each, greedy
    and seeded-sampled: they are all admitted on their prompts' blocks, grow, and the cache runs out, so
    the latest arrivals are preempted, their KV published, and resumed later. Each one's tokens equal what
    it generates alone (float32), every block comes back, and the shard was granted blocks as rows grew."""
    requests = [
        greedy(p, 40 + (i * 7) % 21) if i % 2 else sampled(p, 40 + (i * 7) % 21, seed=i)
        for i, p in enumerate(prompts(8))
    ]

    async def scenario(stack: Stack) -> tuple[list[list[int]], list[list[int]], int, int]:
        alone = [await tokens(stack, r) for r in requests]
        together = await asyncio.gather(*(tokens(stack, r) for r in requests))
        stack.no_leak()
        return alone, list(together), stack.batcher.scheduler.preemptions, stack.client.grants

    alone, together, preemptions, grants = run(
        shard, tiny_model_dir, scenario, num_blocks=24, decode_steps=decode_steps
    )
    assert preemptions > 0 and grants > 0
    assert together == alone
    assert [len(t) for t in together] == [r.max_new_tokens for r in requests]


def test_a_priority_request_runs_first_and_preempts_lower_priorities(shard: ShardProc, tiny_model_dir: Path) -> None:
    """--scheduling-policy priority on a cache that holds about two of the long requests: the urgent one,
    sent last, gets its first token before every long one has finished, by preempting them; all outputs
    still equal those alone."""
    long_ones = [dataclasses.replace(greedy(p, 120), priority=5) for p in prompts(4)]
    urgent = dataclasses.replace(greedy(prompts(5)[4], 8), priority=-1)

    async def scenario(stack: Stack) -> tuple[list[list[int]], list[list[int]], list[int], int]:
        alone = [await tokens(stack, r) for r in (*long_ones, urgent)]
        order: list[int] = []

        async def run_one(index: int, request: ValidatedRequest) -> list[int]:
            out = await tokens(stack, request)
            order.append(index)
            return out

        tasks = [asyncio.create_task(run_one(i, r)) for i, r in enumerate(long_ones)]
        while stack.batcher.in_flight < 2:  # the long ones run
            await asyncio.sleep(0.01)
        together = [await run_one(4, urgent)] + [await t for t in tasks]
        stack.no_leak()
        return alone, together[1:] + together[:1], order, stack.batcher.scheduler.preemptions

    alone, together, order, preemptions = run(
        shard, tiny_model_dir, scenario, num_blocks=20, policy=SchedulingPolicy.PRIORITY
    )
    assert together == alone
    assert order[0] == 4 and preemptions > 0


def test_a_request_that_can_never_fit_is_refused_while_the_others_finish(
    shard: ShardProc, tiny_model_dir: Path
) -> None:
    """A KV budget of 8 blocks (7 usable: 112 tokens). A request of 100 + 30 tokens could never be held, even by
    an empty cache, so it fails at once with a 422 instead of waiting (or preempting others) forever; requests
    that fit, sent with it, finish with their outputs alone, and every block comes back."""
    too_big = greedy(tuple(range(10, 110)), 30)
    fitting = [greedy(p, 20) for p in prompts(3)]

    async def scenario(stack: Stack) -> tuple[list[StreamEvent], list[list[int]], list[list[int]]]:
        alone = [await tokens(stack, r) for r in fitting]
        refused_task = asyncio.create_task(_all_events(stack, too_big))
        together = await asyncio.gather(*(tokens(stack, r) for r in fitting))
        refused = await refused_task
        stack.no_leak()
        return refused, alone, list(together)

    refused, alone, together = run(shard, tiny_model_dir, scenario, num_blocks=8)
    assert isinstance(refused[-1], ErrorEvent) and refused[-1].error.http_status == 422
    assert "needs 129 KV slots" in str(refused[-1].error)
    assert together == alone


async def _all_events(stack: Stack, request: ValidatedRequest) -> list[StreamEvent]:
    return [e async for e in events(stack.batcher.submit([request]))]


WINDOW = 8


@pytest.fixture(scope="module")
def windowed_model_dir(make_tiny_model: Callable[..., Path]) -> Path:
    return make_tiny_model("mistral", **window_options("mistral", WINDOW))  # every layer windowed


@pytest.fixture(scope="module")
def windowed_shard(windowed_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardProc]:
    yield from serve(windowed_model_dir, tmp_path_factory.mktemp("router-core-window"))


def test_blocks_behind_every_layers_window_go_back_and_outputs_equal_transformers(
    windowed_shard: ShardProc, windowed_model_dir: Path
) -> None:
    """Mistral with a window of 8 on every layer: a decoding request holds only the blocks of its window (and
    a margin), not its whole sequence; greedy float32 tokens of prompts and generations far longer than the
    window equal transformers', alone and six at once on a cache so small that some are preempted and
    recompute; a sequence that gave blocks back is not published to the prefix cache, so the same prompt
    again is computed whole; every block comes back."""
    prompt_list = [tuple(5 + (i * 13 + j * 7) % 300 for j in range(20 + 4 * i)) for i in range(6)]
    new_tokens = 70
    expected = [greedy_oracle(windowed_model_dir, list(p), new_tokens) for p in prompt_list]

    async def scenario(stack: Stack) -> tuple[list[int], list[int], list[list[int]], list[int], int]:
        first = await tokens(stack, greedy(prompt_list[0], new_tokens))
        alone_peak = max(stack.client.used_blocks)
        again = await tokens(stack, greedy(prompt_list[0], new_tokens))
        together = await asyncio.gather(*(tokens(stack, greedy(p, new_tokens)) for p in prompt_list))
        stack.no_leak()
        assert stack.allocator.cached_blocks == 0  # nothing of a released sequence was published
        cache_lens = [r.requests[0].cache_len for r in stack.client.prefills[:2]]
        return first, again, list(together), cache_lens + [alone_peak], stack.batcher.scheduler.preemptions

    first, again, together, figures, preemptions = run(
        windowed_shard, windowed_model_dir, scenario, num_blocks=9, decode_steps=4, release_window=WINDOW
    )
    assert first == again == expected[0]
    assert together == expected
    cache_lens, alone_peak = figures[:2], figures[2]
    assert cache_lens == [0, 0]
    # 20 + 70 positions would be 6 blocks of 16; behind a window of 8 it never holds more than 4.
    assert alone_peak <= 4
    assert preemptions > 0


def test_importing_the_router_never_imports_torch() -> None:
    code = (
        "import sys, tgictl.runtime.router.service, tgictl.runtime.router.http.app, tgictl.commands.router\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=120)
