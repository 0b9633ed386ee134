"""Queue.next_batch: the cases of TGI's own queue tests, plus chunking and prefix-cache cases."""

from __future__ import annotations

from tgictl.proto.messages import SamplingParams
from tgictl.runtime.router.kv.block_allocator import BlockAllocator
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator
from tgictl.runtime.router.request import ValidatedRequest
from tgictl.runtime.router.scheduling.entry import Entry
from tgictl.runtime.router.scheduling.queue import Queue


def entry(input_ids: tuple[int, ...] = (7,), max_new_tokens: int = 1, cancelled: bool = False) -> Entry:
    request = ValidatedRequest(input_ids=input_ids, sampling=SamplingParams(), max_new_tokens=max_new_tokens)
    return Entry(request=request, send=lambda event: None, is_cancelled=lambda: cancelled)


def tgi_queue() -> Queue:
    # TGI's test state: block_size 1, max_batch_total_tokens 16 -> 16 blocks (block 0 reserved)
    return Queue(BlockAllocator(num_blocks=16, block_size=1), block_size=1)


def test_append_assigns_increasing_ids() -> None:
    queue = tgi_queue()
    assert queue.append(entry()) == 0
    assert queue.append(entry()) == 1
    assert len(queue) == 2


def test_next_batch_empty() -> None:
    queue = tgi_queue()
    assert queue.next_batch(None, 1) is None
    assert queue.next_batch(1, 1) is None


def test_next_batch_takes_entries_in_order() -> None:
    queue = tgi_queue()
    queue.append(entry())
    queue.append(entry())
    nb = queue.next_batch(None, 2)
    assert nb is not None
    assert list(nb.entries) == [0, 1]
    assert nb.batch.id == 0
    assert all(e.batch_time is not None for e in nb.entries.values())
    queue.append(entry())
    nb = queue.next_batch(None, 2)
    assert nb is not None and list(nb.entries) == [2] and nb.batch.id == 1


def test_next_batch_max_size() -> None:
    queue = tgi_queue()
    queue.append(entry())
    queue.append(entry())
    nb = queue.next_batch(1, 2)
    assert nb is not None and list(nb.entries) == [0]
    assert len(queue) == 1


def test_next_batch_prefill_budget() -> None:
    queue = tgi_queue()
    queue.append(entry())
    queue.append(entry())
    nb = queue.next_batch(None, 1)
    assert nb is not None and list(nb.entries) == [0]
    queue.append(entry())
    nb = queue.next_batch(None, 3)
    assert nb is not None and list(nb.entries) == [1, 2] and nb.batch.id == 1


def test_zero_budget_gives_nothing() -> None:
    queue = tgi_queue()
    queue.append(entry())
    assert queue.next_batch(1, 0) is None
    assert queue.next_batch(None, 0) is None
    assert queue.next_batch(0, 5) is None
    assert len(queue) == 1


def test_cancelled_entries_are_dropped() -> None:
    queue = tgi_queue()
    queue.append(entry(cancelled=True))
    assert queue.next_batch(None, 2) is None
    assert len(queue) == 0 and queue.dropped == 1


def test_admission_takes_blocks_for_the_prompt_and_the_steps_ahead_only() -> None:
    allocator = BlockAllocator(num_blocks=64, block_size=4)
    queue = Queue(allocator, block_size=4)
    queue.append(entry(input_ids=tuple(range(10)), max_new_tokens=7))
    queue.append(entry(input_ids=tuple(range(10)), max_new_tokens=7))
    queue.append(entry(input_ids=tuple(range(10)), max_new_tokens=2))
    nb = queue.next_batch(None, 100, ahead=3)
    assert nb is not None
    first, second, short = nb.batch.requests
    # 10 prompt tokens + 3 ahead = 13 positions: 4 blocks of 4; not the 16 of input + max_new_tokens - 1
    assert len(first.blocks) == 4 and nb.entries[first.id].allocation.tokens == 13
    assert first.cache_len == 0 and first.chunk_len is None
    # never more than the whole budget: 10 + 2 - 1 = 11 positions
    assert nb.entries[short.id].allocation.tokens == 11 and len(short.blocks) == 3
    assert allocator.free_blocks == 63 - 4 - 4 - 3


def test_admission_keeps_the_watermark_free() -> None:
    allocator = BlockAllocator(num_blocks=9, block_size=4)  # 8 usable blocks
    queue = Queue(allocator, block_size=4)
    for _ in range(3):
        queue.append(entry(input_ids=tuple(range(7)), max_new_tokens=20))  # 7 + 1 ahead: 2 blocks each
    nb = queue.next_batch(None, 100, reserve=3)
    assert nb is not None and len(nb.entries) == 2  # a third would leave 2 of the 3 reserved blocks
    assert allocator.free_blocks == 4 and len(queue) == 1


def test_allocation_failure_stops_the_walk_in_fifo_order() -> None:
    allocator = BlockAllocator(num_blocks=5, block_size=1)  # 4 usable blocks
    queue = Queue(allocator, block_size=1)
    queue.append(entry(input_ids=(1, 2), max_new_tokens=2))  # 3 blocks
    queue.append(entry(input_ids=(1, 2), max_new_tokens=2))  # 3 more: does not fit
    queue.append(entry(input_ids=(1,), max_new_tokens=1))  # would fit, but FIFO: no skipping
    nb = queue.next_batch(None, 100)
    assert nb is not None and list(nb.entries) == [0]
    assert len(queue) == 2


def test_prompt_longer_than_the_budget_is_chunked() -> None:
    allocator = BlockAllocator(num_blocks=64, block_size=4)
    queue = Queue(allocator, block_size=4)
    queue.append(entry(input_ids=tuple(range(5)), max_new_tokens=2))
    queue.append(entry(input_ids=tuple(range(30)), max_new_tokens=2))
    queue.append(entry(input_ids=tuple(range(3)), max_new_tokens=2))
    nb = queue.next_batch(None, 16)
    assert nb is not None and list(nb.entries) == [0, 1]
    first, second = nb.batch.requests
    assert first.chunk_len is None
    assert second.chunk_len == 11  # 16 - 5 prompt tokens already in this prefill
    assert len(queue) == 1


def test_cached_prefix_sets_cache_len_and_a_full_hit_recomputes_the_last_token_privately() -> None:
    allocator = RadixAllocator(num_blocks=64, block_size=4)
    queue = Queue(allocator, block_size=4)
    prompt = tuple(range(100, 112))  # three full blocks
    queue.append(entry(input_ids=prompt, max_new_tokens=4))
    nb = queue.next_batch(None, 100)
    assert nb is not None
    first = nb.entries[0]
    assert first.allocation is not None
    allocator.free(first.allocation, prompt)  # its prompt KV was computed: publish it

    queue.append(entry(input_ids=prompt + (1, 2, 3, 4, 5), max_new_tokens=4))
    queue.append(entry(input_ids=prompt, max_new_tokens=4))
    nb = queue.next_batch(None, 100)
    assert nb is not None
    longer, same = nb.batch.requests
    assert longer.cache_len == 12
    # A fully cached prompt still computes its last position for logits; that position lands in a
    # block of its own, never in the cached block other requests read.
    assert same.cache_len == 8 and same.blocks[:2] == longer.blocks[:2]
    assert same.blocks[2] not in longer.blocks
    # The entries remember it for the client's usage (cached_tokens): the first round's cache_len.
    assert [e.cached_tokens for e in nb.entries.values()] == [12, 8] and first.cached_tokens == 0
    allocator.check_integrity()




def test_a_burst_of_short_prompts_is_split_by_the_group_limit_and_a_long_prompt_is_not() -> None:
    allocator = BlockAllocator(num_blocks=512, block_size=4)
    queue = Queue(allocator, block_size=4)
    for _ in range(16):
        queue.append(entry(input_ids=tuple(range(64)), max_new_tokens=2))
    # 16 prompts of 64 tokens fit the budget; the group limit starts 8 now (512 tokens) and 8 at the next step.
    first = queue.next_batch(None, 4096, group_tokens=512)
    assert first is not None and list(first.entries) == list(range(8))
    assert all(r.chunk_len is None for r in first.batch.requests)
    second = queue.next_batch(None, 4096, group_tokens=512)
    assert second is not None and list(second.entries) == list(range(8, 16)) and len(queue) == 0
    # A request is never cut for the group: the 9th whole prompt would pass 500 tokens, so it waits.
    for _ in range(16):
        queue.append(entry(input_ids=tuple(range(64)), max_new_tokens=2))
    seven = queue.next_batch(None, 4096, group_tokens=500)
    assert seven is not None and list(seven.entries) == list(range(16, 23))
    # One long prompt still fills the whole budget (it is chunked by the budget only); nothing joins it.
    queue = Queue(BlockAllocator(num_blocks=2048, block_size=4), block_size=4)
    queue.append(entry(input_ids=tuple(range(3000)), max_new_tokens=2))
    queue.append(entry(input_ids=tuple(range(8)), max_new_tokens=2))
    nb = queue.next_batch(None, 2048, group_tokens=512)
    assert nb is not None and list(nb.entries) == [0] and nb.batch.requests[0].chunk_len == 2048
    # Without a group limit the whole burst is one step, as before.
    queue = Queue(BlockAllocator(num_blocks=512, block_size=4), block_size=4)
    for _ in range(16):
        queue.append(entry(input_ids=tuple(range(64)), max_new_tokens=2))
    assert len(queue.next_batch(None, 4096).entries) == 16  # type: ignore[union-attr]
