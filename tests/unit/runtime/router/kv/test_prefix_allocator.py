"""RadixAllocator and RadixTrie: TGI radix.rs scenarios with its exact block numbers (blocks come
from the END of the free list), plus what our publish-only-computed-blocks rule changes."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tgictl.errors import AllocatorError, AllocatorIntegrityError
from tgictl.runtime.router.kv.block_allocator import BlockAllocation, KvAllocator
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator, RadixTrie


def allocate(cache: RadixAllocator, tokens: int, prompt: Sequence[int] | None) -> BlockAllocation:
    allocation = cache.allocate(tokens, prompt)
    cache.check_integrity()
    assert allocation is not None
    return allocation


def free(
    cache: RadixAllocator, allocation: BlockAllocation, computed: Sequence[int] | None
) -> None:
    cache.free(allocation, computed)
    cache.check_integrity()


def trie_blocks(trie: RadixTrie, key: Sequence[int]) -> list[int]:
    _, blocks = trie.find(key)
    trie.check_integrity()
    return blocks


# -- 6.4 scenarios 1-6: the allocator (full prompt passed as computed, as TGI caches it) ----------


def test_allocator_block_size() -> None:
    cache = RadixAllocator(12, 2)
    a = allocate(cache, 8, [0, 1, 2, 3])
    assert a.blocks == (8, 9, 10, 11)
    assert a.tokens == 8
    assert a.prefix_len == 0
    free(cache, a, [0, 1, 2, 3])
    a = allocate(cache, 8, [0, 1, 2, 3])
    assert a.blocks == (8, 9, 10, 11)
    assert a.tokens == 8
    assert a.prefix_len == 4


def test_allocator_block_size_non_aligned() -> None:
    cache = RadixAllocator(12, 2)
    a = allocate(cache, 7, [0, 1, 2])
    assert a.blocks == (8, 9, 10, 11)
    assert a.tokens == 7
    assert a.prefix_len == 0
    free(cache, a, [0, 1, 2])
    a = allocate(cache, 7, [0, 1, 2])
    assert a.blocks == (8, 9, 10, 11)
    assert a.tokens == 7
    assert a.prefix_len == 2  # only the full block [0, 1] was cached


def test_allocator_reuses_prefixes() -> None:
    cache = RadixAllocator(12, 1)
    a = allocate(cache, 8, [0, 1, 2, 3])
    assert a.blocks == (4, 5, 6, 7, 8, 9, 10, 11)
    assert a.tokens == len(a.blocks)
    assert a.prefix_len == 0
    free(cache, a, [0, 1, 2, 3])
    assert (cache.used_blocks, cache.cached_blocks, cache.free_blocks) == (0, 4, 7)
    a = allocate(cache, 8, [0, 1, 2, 3])
    assert a.blocks == (4, 5, 6, 7, 8, 9, 10, 11)
    assert a.prefix_len == 4
    assert (cache.used_blocks, cache.cached_blocks, cache.free_blocks) == (8, 0, 3)


def test_allocator_collects_older_prefixes_first() -> None:
    cache = RadixAllocator(7, 1)
    a1 = allocate(cache, 4, [0, 1, 2, 3])
    assert (a1.blocks, a1.prefix_len) == ((3, 4, 5, 6), 0)
    a2 = allocate(cache, 2, [4, 5])
    assert (a2.blocks, a2.prefix_len) == ((1, 2), 0)
    free(cache, a1, [0, 1, 2, 3])
    free(cache, a2, [4, 5])
    assert (cache.free_blocks, cache.cached_blocks) == (0, 6)
    a3 = allocate(cache, 4, [6, 7, 8, 9])  # evicts a1's prompt, the least recently used
    assert (a3.blocks, a3.prefix_len) == ((3, 4, 5, 6), 0)
    assert trie_blocks(cache.trie, [4, 5]) == [1, 2]
    assert trie_blocks(cache.trie, [0, 1, 2, 3]) == []


def test_allocator_frees_fully_overlapping_prefills() -> None:
    cache = RadixAllocator(10, 1)
    a1 = allocate(cache, 4, [0, 1, 2, 3])
    a2 = allocate(cache, 4, [0, 1, 2, 3])
    assert a1.prefix_len == a2.prefix_len == 0
    free(cache, a2, [0, 1, 2, 3])
    free(cache, a1, [0, 1, 2, 3])  # all 4 tokens already cached: a1's blocks are duplicates
    a3 = allocate(cache, 4, [0, 1, 2, 3])
    assert a3.prefix_len == 4
    assert a3.blocks == a2.blocks
    assert cache.free_blocks == 5  # 10 - reserved 1 - 4 cached


def test_allocator_frees_partially_overlapping_prefills() -> None:
    cache = RadixAllocator(20, 1)
    a1 = allocate(cache, 4, [0, 1])
    assert (a1.blocks, a1.prefix_len) == ((16, 17, 18, 19), 0)
    free(cache, a1, [0, 1])
    a2 = allocate(cache, 8, [0, 1, 2, 3, 4, 5])
    assert (a2.blocks, a2.prefix_len) == ((16, 17, 12, 13, 14, 15, 18, 19), 2)
    a3 = allocate(cache, 8, [0, 1, 2, 3, 6, 7])
    assert (a3.blocks, a3.prefix_len) == ((16, 17, 6, 7, 8, 9, 10, 11), 2)
    free(cache, a3, [0, 1, 2, 3, 6, 7])
    free(cache, a2, [0, 1, 2, 3, 4, 5])  # [2, 3] came from a3 meanwhile: a2's 12, 13 are freed
    assert cache.free_blocks == 11
    a4 = allocate(cache, 6, [0, 1, 2, 3, 4, 5])
    assert (a4.blocks, a4.prefix_len) == ((16, 17, 6, 7, 14, 15), 6)
    assert cache.free_blocks == 11
    a5 = allocate(cache, 6, [0, 1, 2, 3, 6, 7])
    assert (a5.blocks, a5.prefix_len) == ((16, 17, 6, 7, 8, 9), 6)
    assert cache.free_blocks == 11


# -- 6.4 scenarios 7-12: the trie ------------------------------------------------------------


def test_trie_insertions_have_correct_prefix_len() -> None:
    trie = RadixTrie(1)
    assert trie.insert([0, 1, 2], [0, 1, 2]) == 0
    assert trie.insert([0, 1, 2], [0, 1, 2]) == 3
    assert trie.insert([1, 2, 3], [1, 2, 3]) == 0
    assert trie.insert([0, 1, 2, 3, 4], [0, 1, 2, 3, 4]) == 3
    assert trie.insert([0, 1, 2, 3, 5, 6, 7], [0, 1, 2, 3, 5, 6, 7]) == 4  # splits [3, 4]
    trie.check_integrity()
    assert trie.num_blocks == 3 + 3 + 2 + 3


def test_trie_insertions_block_size() -> None:
    trie = RadixTrie(2)
    assert trie.insert([0, 1, 2, 3], [0, 1]) == 0
    assert trie.insert([0, 1, 2, 3], [0, 1]) == 4
    assert trie.insert([1, 2, 3, 4], [1, 2]) == 0
    assert trie.insert([0, 1, 2, 3, 4, 5], [0, 1, 2]) == 4
    assert trie.insert([0, 1, 3, 4, 5, 6, 7, 8], [0, 1, 2, 3]) == 2  # split on a block boundary
    trie.check_integrity()
    assert trie_blocks(trie, [0, 1, 3, 4, 5, 6, 7, 8]) == [0, 1, 2, 3]
    assert trie_blocks(trie, [0, 1, 2, 3, 4, 5]) == [0, 1, 2]
    assert trie_blocks(trie, [0, 1, 2]) == [0]  # a partial block is never a hit
    assert trie_blocks(trie, [0]) == []


def test_trie_insert_rejects_ragged_blocks() -> None:
    trie = RadixTrie(2)
    with pytest.raises(AllocatorError, match="3 tokens do not fill 1 blocks of 2 tokens"):
        trie.insert([0, 1, 2], [7])


def _inserted_trie() -> RadixTrie:
    trie = RadixTrie(1)
    for key in ([0, 1, 2], [1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 5, 6, 7]):
        trie.insert(key, key)
    return trie


def test_trie_get_returns_correct_blocks() -> None:
    trie = _inserted_trie()
    assert trie_blocks(trie, [0]) == [0]
    assert trie_blocks(trie, [0, 1, 2]) == [0, 1, 2]
    assert trie_blocks(trie, [1, 2, 3]) == [1, 2, 3]
    assert trie_blocks(trie, [0, 1, 2, 3]) == [0, 1, 2, 3]
    assert trie_blocks(trie, [0, 1, 2, 3, 4]) == [0, 1, 2, 3, 4]
    assert trie_blocks(trie, [0, 1, 2, 3, 5]) == [0, 1, 2, 3, 5]
    assert trie_blocks(trie, [9]) == []


def test_trie_evict_removes_correct_blocks() -> None:
    trie = RadixTrie(1)
    for key in ([0, 1, 2], [0, 1, 2, 3, 5, 6, 7], [0, 1, 2, 3, 4], [1, 2, 3]):
        trie.insert(key, key)
    long_key = [0, 1, 2, 3, 5, 6, 7]
    assert trie.evict(1) == [7]  # less than the leaf holds: truncate it
    trie.check_integrity()
    assert trie_blocks(trie, long_key) == [0, 1, 2, 3, 5, 6]
    trie.find([0, 1, 2, 3, 4])  # refresh the other leaves
    trie.find([1, 2, 3])
    assert trie.evict(2) == [5, 6]  # exactly the leaf: remove the node
    trie.check_integrity()
    assert trie_blocks(trie, long_key) == [0, 1, 2, 3]
    trie.find([1, 2, 3])
    assert trie.evict(3) == [4, 3, 2]  # [4], then its now-leaf parent [3], then truncate [0, 1, 2]
    trie.check_integrity()
    assert trie_blocks(trie, [0, 1, 2, 3, 4]) == [0, 1]
    assert trie.evict(10) == [1, 2, 3, 0, 1]  # everything, fewer than asked
    trie.check_integrity()
    assert trie.num_blocks == 0
    assert trie.evict(1) == []


def test_trie_pinned_nodes_are_not_evicted() -> None:
    trie = _inserted_trie()
    node, blocks = trie.find([0, 1, 2, 3, 4])
    assert blocks == [0, 1, 2, 3, 4]
    trie.pin(node)
    trie.check_integrity()
    assert trie.pinned_blocks == 5  # [0, 1, 2], [3], [4]
    assert trie.evictable_blocks == trie.num_blocks - 5
    assert sorted(trie.evict(100)) == [1, 2, 3, 5, 6, 7]
    assert trie_blocks(trie, [0, 1, 2, 3, 4]) == [0, 1, 2, 3, 4]
    trie.unpin(node)
    trie.check_integrity()
    with pytest.raises(AllocatorIntegrityError, match="which no allocation pins"):
        trie.unpin(node)
    assert trie.evict(100) == [4, 3, 0, 1, 2]


def test_full_match_returns_correct_node() -> None:
    trie = RadixTrie(1)
    trie.insert([0, 1, 2], [0, 1, 2])
    node, blocks = trie.find([0, 1, 2])
    assert node is not trie.root
    assert node.key == (0, 1, 2) and blocks == [0, 1, 2]


def test_partial_match_does_not_recurse() -> None:
    trie = RadixTrie(1)
    trie.insert([0, 1, 2], [0, 1, 2])
    trie.insert([0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5])
    node, blocks = trie.find([0, 1, 3, 4, 5])
    assert blocks == [0, 1]
    same, _ = trie.find([0, 1])
    assert node is same and node.key == (0, 1, 2)  # the whole partly matched node


# -- what publishing only computed KV changes ("Decisions" in docs/architecture.md) ----------------------------


def test_never_prefilled_allocation_publishes_nothing() -> None:
    cache = RadixAllocator(12, 1)
    a = allocate(cache, 8, [0, 1, 2, 3])
    free(cache, a, None)
    assert (cache.free_blocks, cache.cached_blocks) == (11, 0)
    assert allocate(cache, 8, [0, 1, 2, 3]).prefix_len == 0


def test_only_full_blocks_of_the_computed_prefix_are_published() -> None:
    cache = RadixAllocator(12, 2)
    a = allocate(cache, 9, [0, 1, 2, 3, 4, 5, 6])  # blocks 7..11
    free(cache, a, [0, 1, 2])  # a chunk of 3 tokens was computed: one full block
    assert (cache.used_blocks, cache.cached_blocks, cache.free_blocks) == (0, 1, 10)
    b = allocate(cache, 9, [0, 1, 2, 3, 4, 5, 6])
    assert b.prefix_len == 2 and b.blocks[0] == a.blocks[0]
    free(cache, b, [0, 1, 2, 3, 4, 5, 6])
    assert cache.cached_blocks == 3  # [0,1] [2,3] [4,5]; [6] is a partial block
    c = allocate(cache, 9, [0, 1, 2, 3, 4, 5, 6])
    assert c.prefix_len == 6 and c.blocks[:3] == b.blocks[:3]


def test_computed_prefix_shorter_than_cached_prefix_frees_only_the_suffix() -> None:
    cache = RadixAllocator(12, 1)
    free(cache, allocate(cache, 4, [0, 1, 2, 3]), [0, 1, 2, 3])
    a = allocate(cache, 6, [0, 1, 2, 3, 4])
    assert a.prefix_len == 4
    free(cache, a, [0, 1])
    assert (cache.used_blocks, cache.cached_blocks, cache.free_blocks) == (0, 4, 7)


def test_publishing_without_a_prompt_key() -> None:
    # decoder_input_details: no cache lookup, but the recomputed prompt is still valid KV.
    cache = RadixAllocator(12, 1)
    a = allocate(cache, 5, None)
    free(cache, a, [5, 6, 7])
    b = allocate(cache, 5, [5, 6, 7])
    assert (b.prefix_len, b.blocks[:3]) == (3, a.blocks[:3])


def test_whole_prompt_hit_is_not_reduced_here() -> None:
    cache = RadixAllocator(12, 1)
    free(cache, allocate(cache, 3, [4, 5, 6]), [4, 5, 6])
    a = allocate(cache, 3, [4, 5, 6])
    assert a.prefix_len == 3 and len(a.blocks) == 3  # the queue makes it 2


# -- failure, misuse, integrity --------------------------------------------------------------


def test_failed_allocation_pins_nothing_and_keeps_the_cache() -> None:
    cache = RadixAllocator(8, 1)
    free(cache, allocate(cache, 4, [0, 1, 2, 3]), [0, 1, 2, 3])
    held = allocate(cache, 3, [9])
    # The prefix [0, 1, 2, 3] is found and pinned, the 2 other blocks exist nowhere.
    assert cache.allocate(6, [0, 1, 2, 3, 7]) is None
    cache.check_integrity()
    assert (cache.used_blocks, cache.cached_blocks, cache.free_blocks) == (3, 4, 0)
    assert cache.allocate(2, [0, 1]) is not None  # the cache survived the failed request
    cache.check_integrity()
    free(cache, held, None)


def test_eviction_when_it_fits_hands_out_the_evicted_blocks() -> None:
    cache = RadixAllocator(8, 1)
    free(cache, allocate(cache, 4, [0, 1, 2, 3]), [0, 1, 2, 3])  # cached: 4..7
    a = allocate(cache, 5, [9])  # 3 free + 2 evicted from the end of [0, 1, 2, 3]
    assert a.blocks == (1, 2, 3, 6, 7)
    assert trie_blocks(cache.trie, [0, 1, 2, 3]) == [4, 5]


def test_generated_tokens_after_the_prompt_are_published_too() -> None:
    """A continuation round frees with its prompt plus the tokens it generated: all of them cached."""
    cache = RadixAllocator(12, 2)
    a = allocate(cache, 8, [0, 1, 2])
    free(cache, a, [0, 1, 2, 7, 8, 9])  # 3 prompt + 3 generated tokens: 3 full blocks of 2
    b = allocate(cache, 8, [0, 1, 2, 7, 8, 9, 4])
    assert b.prefix_len == 6
    cache.check_integrity()


def test_misuse_raises_allocator_errors() -> None:
    cache = RadixAllocator(12, 1)
    with pytest.raises(AllocatorError, match="3 prefill tokens exceed the budget of 2 tokens"):
        cache.allocate(2, [0, 1, 2])
    with pytest.raises(AllocatorError, match="tokens must be >= 0"):
        cache.allocate(-1, None)
    a = allocate(cache, 4, [0, 1])
    with pytest.raises(AllocatorError, match="do not start with the prefill_tokens"):
        cache.free(a, [0, 2])
    with pytest.raises(AllocatorError, match="do not start with the prefill_tokens"):
        cache.free(a, [1, 1, 5])
    with pytest.raises(AllocatorError, match="5 computed tokens exceed"):
        cache.free(a, [0, 1, 2, 3, 4])
    cache.check_integrity()  # rejected frees changed nothing
    free(cache, a, [0, 1])
    with pytest.raises(AllocatorError, match="allocation 1 is not live"):
        cache.free(a, [0, 1])


def test_check_integrity_detects_corruption() -> None:
    cache = RadixAllocator(12, 1)
    free(cache, allocate(cache, 4, [0, 1, 2, 3]), [0, 1, 2, 3])
    a = allocate(cache, 6, [0, 1, 2, 3, 4])
    cache._free.append(a.blocks[-1])  # a block owned twice
    with pytest.raises(AllocatorIntegrityError, match=f"block {a.blocks[-1]} is owned twice"):
        cache.check_integrity()
    cache._free.pop()
    cache._free.append(0)
    with pytest.raises(AllocatorIntegrityError, match="holds block 0"):
        cache.check_integrity()
    cache._free.pop()
    node, _ = cache.trie.find([0, 1, 2, 3])
    node.ref_count += 1
    with pytest.raises(AllocatorIntegrityError, match="leaf set|pins_below|pins"):
        cache.check_integrity()
    node.ref_count -= 1
    cache.check_integrity()


def test_is_a_kv_allocator() -> None:
    assert isinstance(RadixAllocator(4, 16), KvAllocator)
