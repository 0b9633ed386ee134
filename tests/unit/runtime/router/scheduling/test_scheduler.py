"""The scheduler with plain calls: blocks on demand, grants, preemption and its victims, resumption,
priorities, and (through the batching loop on a fake shard) that every request finishes with its own
tokens however often it is preempted."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tgictl.config import SchedulingPolicy
from tgictl.proto.messages import (
    BlockGrant,
    CachedBatch,
    FinishReason,
    GeneratedText,
    Generation,
    SamplingParams,
    StepResult,
    Tokens,
)
from tgictl.runtime.router.kv.block_allocator import BlockAllocator, KvAllocator
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator
from tgictl.runtime.router.request import EndEvent, StreamEvent, TokenEvent, ValidatedRequest
from tgictl.runtime.router.scheduling.batcher import Batcher, BatcherConfig
from tgictl.runtime.router.scheduling.entry import Entry, RequestStatus, TokenTexts
from tgictl.runtime.router.scheduling.event_channel import events
from tgictl.runtime.router.scheduling.queue import Queue
from tgictl.runtime.router.scheduling.scheduler import Scheduler, SchedulerConfig, StepPlan
from tgictl.testing.fake_shard import FakeShard


@pytest.fixture(scope="module")
def texts(tiny_tokenizer_dir: Path) -> TokenTexts:
    tokenizer = Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    return TokenTexts(decoder=tokenizer, special_ids=frozenset())


def entry(prompt: tuple[int, ...], max_new_tokens: int, priority: int = 0, seed: int = 0) -> Entry:
    request = ValidatedRequest(input_ids=prompt, sampling=SamplingParams(do_sample=True, seed=seed),
                               max_new_tokens=max_new_tokens, ignore_eos=True, priority=priority)
    return Entry(request, send=lambda event: None, is_cancelled=lambda: False)


def scheduler(texts: TokenTexts, allocator: KvAllocator, policy: SchedulingPolicy = SchedulingPolicy.FCFS) -> Scheduler:
    queue = Queue(allocator, block_size=allocator.block_size, policy=policy)
    return Scheduler(queue, allocator, texts, SchedulerConfig(max_batch_prefill_tokens=64))


def step(sched: Scheduler, plan: StepPlan, token: int = 40) -> CachedBatch:
    """What a shard answers: one token for every running request (none finishes)."""
    ids = tuple(sched.running)
    generations = tuple(Generation(rid, Tokens((token + rid,), (-0.5,))) for rid in ids)
    cached, kept = sched.update(StepResult(generations, CachedBatch(9, ids, 0, len(ids))))
    assert cached is not None and kept == list(ids)
    return cached


def test_a_request_gets_its_prompts_blocks_then_one_more_when_it_crosses_into_it(texts: TokenTexts) -> None:
    allocator = BlockAllocator(num_blocks=64, block_size=4)
    sched = scheduler(texts, allocator)
    sched.add(entry((1, 2, 3), 20))
    plan = sched.schedule(None, 1)
    assert plan is not None and plan.prefill is not None and plan.grants == ()
    (request,) = plan.prefill.batch.requests
    assert len(request.blocks) == 1  # 3 prompt tokens + its first step: 4 positions, not 3 + 20 - 1
    batch = step(sched, plan)  # the first token: 4 tokens, all inside the block
    plan = sched.schedule(batch, 1)
    # The next step writes position 3 (in the block); the look-ahead step after it position 4: one block more.
    assert plan is not None and plan.prefill is None and plan.steps == 1
    assert [(g.request_id, len(g.blocks)) for g in plan.grants] == [(0, 1)]
    batch = step(sched, plan)
    plan = sched.schedule(batch, 8)  # 5 tokens, 8 steps asked: positions up to 5 + 8 - 1, and the one ahead
    assert plan is not None and plan.steps == 8 and [len(g.blocks) for g in plan.grants] == [2]
    assert len(sched.running[0].allocation.blocks) == 4  # type: ignore[union-attr]
    allocator.check_integrity()


def test_a_full_cache_preempts_the_latest_arrival_and_resumes_it_where_it_stopped(texts: TokenTexts) -> None:
    allocator = RadixAllocator(num_blocks=5, block_size=4)  # 4 usable blocks: 16 positions
    sched = scheduler(texts, allocator)
    first, second = entry((1, 2, 3, 4), 7), entry((5, 6, 7, 8), 10, seed=7)
    sched.add(first)
    sched.add(second)
    plan = sched.schedule(None, 1)
    assert plan is not None and plan.prefill is not None and list(plan.prefill.entries) == [0, 1]
    batch = step(sched, plan)
    for _ in range(4):  # 4 + 5 tokens each: the next step of each crosses into a third block
        batch = step(sched, sched.schedule(batch, 1))  # type: ignore[arg-type]
    plan = sched.schedule(batch, 1)
    assert plan is not None and plan.preempted == (1,) and plan.prefill is None
    assert plan.grants == (BlockGrant(0, first.allocation.blocks[2:]),)  # type: ignore[union-attr]
    assert second.status is RequestStatus.PREEMPTED and second.allocation is None and sched.preemptions == 1
    # It waits as the rest of its round: prompt + its 5 tokens, 5 more to go, its random stream at step 5.
    assert second.round.input_ids == (5, 6, 7, 8) + tuple(second.generated_ids) and len(second.generated_ids) == 5
    assert second.round.max_new_tokens == 5 and second.round.sampling.step_offset == 5
    assert second.round.sampling.seed == 7 and sched.queue.head() is second
    allocator.check_integrity()
    # Its computed KV (prompt + 4 fed-back tokens: 2 full blocks) was published; the growing request took one back.
    assert allocator.trie.num_blocks >= 1
    batch = step(sched, plan)
    final = Generation(0, Tokens((99,), (-0.5,)), generated_text=GeneratedText(7, FinishReason.LENGTH, None))
    sched.update(StepResult((final,), None))
    first_blocks = allocator.trie.num_blocks
    plan = sched.schedule(None, 1)
    assert plan is not None and plan.prefill is not None and list(plan.prefill.entries) == [2]
    (resumed,) = plan.prefill.batch.requests
    assert resumed.cache_len > 0 and first_blocks > 0  # it resumes from what the cache kept of its KV
    assert resumed.stopping.max_new_tokens == 5 and second.status is RequestStatus.RUNNING
    allocator.check_integrity()


def test_the_priority_policy_preempts_the_lowest_priority_and_admits_by_priority(texts: TokenTexts) -> None:
    allocator = BlockAllocator(num_blocks=7, block_size=4)  # 6 usable blocks
    sched = scheduler(texts, allocator, SchedulingPolicy.PRIORITY)
    background = entry((1, 2, 3), 20, priority=5)  # arrives first, lowest priority
    normal = entry((4, 5, 6), 20, priority=1)
    sched.add(background)
    sched.add(normal)
    batch = step(sched, sched.schedule(None, 1))  # type: ignore[arg-type]
    while allocator.free_blocks:  # the two grow until the cache is full (3 blocks each), nobody preempted yet
        plan = sched.schedule(batch, 1)
        assert plan is not None and plan.preempted == ()
        batch = step(sched, plan)
    urgent = entry((7, 8, 9), 4, priority=-3)
    later = entry(tuple(range(1, 10)), 4, priority=1)  # 9 prompt tokens: 3 blocks
    sched.add(later)
    sched.add(urgent)
    assert sched.queue.entries() == [urgent, later]  # by priority, not arrival
    plan = sched.schedule(batch, 1)
    # The urgent request did not fit beside them: the lowest priority (the first arrival) made room. The
    # next one in line does not fit either, but preempts nobody of its own priority or higher.
    assert plan is not None
    assert plan.prefill is not None and list(plan.prefill.entries.values()) == [urgent]
    assert plan.preempted == (0,) and background.status is RequestStatus.PREEMPTED
    assert normal.status is RequestStatus.RUNNING and later.status is RequestStatus.WAITING
    allocator.check_integrity()


def test_under_priority_a_prefill_takes_one_priority_and_fcfs_takes_every_one_that_fits(texts: TokenTexts) -> None:
    for policy in SchedulingPolicy:
        allocator = BlockAllocator(num_blocks=64, block_size=4)
        sched = scheduler(texts, allocator, policy)
        low = [entry((1, 2, 3), 5, priority=5 if policy is SchedulingPolicy.PRIORITY else 0) for _ in range(2)]
        urgent = entry((4, 5, 6), 5)
        for waiting in (*low, urgent):
            sched.add(waiting)
        plan = sched.schedule(None, 1)
        assert plan is not None and plan.prefill is not None
        if policy is SchedulingPolicy.FCFS:  # arrival order, all in one Prefill
            assert list(plan.prefill.entries.values()) == [*low, urgent]
            continue
        # The urgent request's first token comes after its prompt alone, not after the others' too.
        assert list(plan.prefill.entries.values()) == [urgent]
        plan = sched.schedule(step(sched, plan), 1)
        assert plan is not None and plan.prefill is not None and list(plan.prefill.entries.values()) == low


def test_under_priority_a_higher_priority_request_starts_in_the_step_that_preempts_for_blocks(
    texts: TokenTexts,
) -> None:
    """A step whose running requests need a block preempts; nothing else starts in it (it would preempt
    again), except a waiting request of a higher priority than every request it preempted."""
    allocator = BlockAllocator(num_blocks=7, block_size=4)  # 6 usable blocks
    sched = scheduler(texts, allocator, SchedulingPolicy.PRIORITY)
    first, second = entry((1, 2, 3), 20, priority=5), entry((4, 5, 6), 20, priority=5)
    sched.add(first)
    sched.add(second)
    batch = step(sched, sched.schedule(None, 1))  # type: ignore[arg-type]

    def needs_a_block() -> bool:
        return any(e.context_len > len(e.allocation.blocks) * 4 for e in sched.running.values())  # type: ignore[union-attr]

    while allocator.free_blocks or not needs_a_block():  # they grow until the next step must preempt
        plan = sched.schedule(batch, 1)
        assert plan is not None and plan.preempted == ()
        batch = step(sched, plan)
    urgent = entry((7, 8, 9), 4, priority=0)
    sched.add(urgent)
    plan = sched.schedule(batch, 1)
    assert plan is not None and plan.preempted == (1,) and second.status is RequestStatus.PREEMPTED
    assert plan.prefill is not None and list(plan.prefill.entries.values()) == [urgent]
    assert first.status is RequestStatus.RUNNING and sched.queue.entries() == [second]
    allocator.check_integrity()


def test_under_fcfs_a_waiting_request_never_preempts(texts: TokenTexts) -> None:
    allocator = BlockAllocator(num_blocks=4, block_size=4)  # 3 usable blocks
    sched = scheduler(texts, allocator)
    sched.add(entry((1, 2, 3, 4, 5, 6, 7), 5))
    batch = step(sched, sched.schedule(None, 1))  # type: ignore[arg-type]
    sched.add(entry((1, 2, 3, 4, 5, 6, 7), 2, priority=0))
    plan = sched.schedule(batch, 1)
    assert plan is not None and plan.prefill is None and plan.preempted == () and len(sched.queue) == 1


def test_a_request_preempted_before_its_first_token_runs_its_round_again(texts: TokenTexts) -> None:
    allocator = BlockAllocator(num_blocks=64, block_size=4)
    sched = scheduler(texts, allocator)
    waiting = entry((1, 2, 3), 6)
    sched.add(waiting)
    sched.schedule(None, 1)
    round_before = waiting.round
    sched._preempt(waiting, [])  # mid-prefill: nothing computed is known, nothing published
    assert waiting.round is round_before and waiting.status is RequestStatus.PREEMPTED
    assert allocator.free_blocks == allocator.total_blocks


# -- end to end through the batching loop: no livelock, the same tokens however often preempted ---------


SCRIPT = tuple(40 + (i * 13) % 150 for i in range(120))


async def _run(batcher: Batcher, requests: list[ValidatedRequest], stagger: list[float]) -> list[list[StreamEvent]]:
    task = asyncio.create_task(batcher.run())

    async def one(request: ValidatedRequest, delay: float) -> list[StreamEvent]:
        await asyncio.sleep(delay)
        return [e async for e in events(batcher.submit([request]))]

    try:
        return list(await asyncio.wait_for(asyncio.gather(*(one(r, d) for r, d in zip(requests, stagger))), 30))
    finally:
        task.cancel()


@pytest.mark.parametrize("policy", list(SchedulingPolicy))
@pytest.mark.parametrize("seed", range(6))
def test_every_request_finishes_with_its_own_tokens_however_often_it_is_preempted(
    texts: TokenTexts, policy: SchedulingPolicy, seed: int
) -> None:
    """Random lengths, priorities, arrivals and steps per call in a cache far too small for all of them at
    once: every request ends with exactly its tokens (the fake shard's tokens follow the position, so a
    resumed request continues the same text), every block comes back, and requests were preempted."""
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4])
    num_blocks = 1 + (24 + rng.randrange(16)) // block_size
    allocator = RadixAllocator(num_blocks, block_size) if seed % 2 else BlockAllocator(num_blocks, block_size)
    shard = FakeShard(first_token=40, span=200, block_size=block_size)
    shard.script, shard.script_prompt_len = SCRIPT, 3
    config = BatcherConfig(max_batch_prefill_tokens=16, decode_steps=rng.choice([1, 3]),
                           max_batch_size=rng.choice([None, 6]))
    batcher = Batcher(shard, Queue(allocator, block_size=block_size, policy=policy), allocator, texts, config)
    priority = policy is SchedulingPolicy.PRIORITY
    requests = [
        ValidatedRequest(input_ids=(1 + i % 50, 2, 3), sampling=SamplingParams(), ignore_eos=True,
                         max_new_tokens=rng.randrange(1, 24), priority=rng.randrange(-2, 3) if priority else 0)
        for i in range(16)
    ]
    got = asyncio.run(_run(batcher, requests, [rng.choice([0, 0, 0.001, 0.003]) for _ in requests]))
    for request, stream in zip(requests, got):
        end = stream[-1]
        assert isinstance(end, EndEvent) and end.generated_tokens == request.max_new_tokens
        assert [e.token.id for e in stream if isinstance(e, (TokenEvent, EndEvent))] == list(
            SCRIPT[: request.max_new_tokens]
        )
    assert batcher.scheduler.preemptions > 0 and batcher.in_flight == 0 and len(batcher.scheduler.queue) == 0
    allocator.check_integrity()
    assert allocator.free_blocks + allocator.cached_blocks == allocator.total_blocks


def test_a_cancelled_request_that_is_preempted_is_not_queued_again(texts: TokenTexts) -> None:
    allocator = BlockAllocator(num_blocks=64, block_size=4)
    sched = scheduler(texts, allocator)
    gone = {"yes": False}
    leaving = Entry(dataclasses.replace(entry((1, 2, 3), 9).request), send=lambda e: None,
                    is_cancelled=lambda: gone["yes"])
    sched.add(leaving)
    sched.schedule(None, 1)
    gone["yes"] = True
    preempted: list[int] = []
    sched._preempt(leaving, preempted)
    assert preempted == [0] and len(sched.queue) == 0 and leaving.status is RequestStatus.FINISHED


def test_a_burst_starts_over_several_prefills_and_the_first_group_decodes_beside_the_next(texts: TokenTexts) -> None:
    """With prefill_group_tokens the first requests of a burst get their first token after their own prompts;
    the next group's Prefill carries them (the shard's mixed forward), and every block they took is accounted."""
    allocator = BlockAllocator(num_blocks=256, block_size=4)
    queue = Queue(allocator, block_size=4)
    sched = Scheduler(queue, allocator, texts, SchedulerConfig(max_batch_prefill_tokens=4096, prefill_group_tokens=32))
    burst = [entry(tuple(range(1, 9)), 5) for _ in range(10)]  # 8-token prompts: 4 per group of 32
    for waiting in burst:
        sched.add(waiting)
    plan = sched.schedule(None, 4)
    assert plan is not None and plan.prefill is not None and list(plan.prefill.entries.values()) == burst[:4]
    assert plan.steps == 1  # requests still wait: one step, then the next group joins
    plan = sched.schedule(step(sched, plan), 4)
    assert plan is not None and plan.prefill is not None and list(plan.prefill.entries.values()) == burst[4:8]
    plan = sched.schedule(step(sched, plan), 4)
    assert plan is not None and plan.prefill is not None and list(plan.prefill.entries.values()) == burst[8:]
    assert len(sched.running) == 10 and len(sched.queue) == 0
    plan = sched.schedule(step(sched, plan), 4)
    assert plan is not None and plan.prefill is None and plan.steps == 4  # all decode now, several steps per call
