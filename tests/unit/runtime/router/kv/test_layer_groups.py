"""Two layer groups (tgictl/kv_groups.py): block ids are (global, local) pairs, `release` gives back only the local
halves, every block of each group has exactly one owner, and a sequence that released local blocks publishes
nothing (docs/scheduling.md, "Sliding windows")."""

from __future__ import annotations

import random

import pytest

from tgictl.kv_groups import GroupShape, KvGroups, hybrid_window, local_blocks_for, split_blocks
from tgictl.runtime.router.kv.block_allocator import BlockAllocation, BlockAllocator, KvAllocator
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator

BOTH = [BlockAllocator, RadixAllocator]
GROUPS = KvGroups(global_blocks=13, local_blocks=7, window=8)  # shard: 12 + 6 usable blocks


def _halves(blocks: tuple[int, ...]) -> tuple[list[int], list[int]]:
    pairs = [GROUPS.split(b) for b in blocks]
    return [g for g, _ in pairs], [l for _, l in pairs]


@pytest.mark.parametrize("cls", BOTH)
def test_pairs_come_from_both_groups_and_release_frees_only_local_halves(cls: type[KvAllocator]) -> None:
    cache = cls(11, 4, groups=GROUPS)  # the router uses 10 of the shard's 12 global blocks
    prompt = list(range(1, 13))
    grown = cache.grow(cache.allocate(12, prompt), 24)
    assert grown is not None
    global_ids, local_ids = _halves(grown.blocks)
    assert len(set(global_ids)) == len(set(local_ids)) == 6 and 0 not in global_ids + local_ids
    assert max(global_ids) < 11 and max(local_ids) < 7
    assert cache.allocate(4, None) is None  # the local group (6 blocks) is full although 4 global ones are free
    assert cache.free_blocks == 4 and cache.local_free_blocks == 0
    released = cache.release(grown, 4)
    cache.check_integrity()
    assert cache.free_blocks == 4 and cache.used_blocks == 6  # the global layers still need every position
    assert cache.local_free_blocks == 4
    later = cache.grow(released, 40)  # 4 more pairs: the released local halves serve them
    assert later is not None and cache.local_free_blocks == 0 and cache.free_blocks == 0
    cache.check_integrity()
    cache.free(later, prompt + list(range(100, 127)))
    cache.check_integrity()
    assert (cache.free_blocks, cache.local_free_blocks, cache.num_allocations) == (10, 6, 0)
    assert cache.cached_blocks == 0  # released local blocks: nothing is published


def test_an_unreleased_sequence_publishes_pairs_that_a_later_prompt_reuses() -> None:
    cache = RadixAllocator(11, 4, groups=GROUPS)
    prompt = list(range(1, 10))
    first = cache.allocate(9, prompt)
    assert first is not None
    cache.free(first, prompt)  # 2 whole blocks published, both halves
    cache.check_integrity()
    assert cache.cached_blocks == 2 and cache.local_free_blocks == 4
    again = cache.allocate(12, prompt + [5, 6, 7])
    assert again is not None and again.prefix_len == 8 and again.blocks[:2] == first.blocks[:2]
    cache.free(again, None)
    # Evicting a cached pair frees both halves: 6 pairs fit once the cache is evicted.
    whole = cache.allocate(24, None)
    assert whole is not None and cache.cached_blocks == 0
    cache.check_integrity()


@pytest.mark.parametrize("cls", BOTH)
def test_random_allocate_grow_release_free_keeps_every_block_owned_once(cls: type[KvAllocator]) -> None:
    rng = random.Random(43)
    groups = KvGroups(global_blocks=40, local_blocks=15, window=8)
    cache = cls(40, 4, groups=groups)
    live: list[tuple[BlockAllocation, list[int]]] = []
    for _ in range(3000):
        op = rng.random()
        if op < 0.3 or not live:
            prompt = [rng.randrange(3) for _ in range(rng.randrange(1, 12))]
            allocation = cache.allocate(len(prompt) + 1, prompt)
            if allocation is not None:
                live.append((allocation, prompt))
        elif op < 0.6:
            i = rng.randrange(len(live))
            allocation, prompt = live[i]
            grown = cache.grow(allocation, allocation.tokens + rng.randrange(1, 9))
            if grown is not None:
                live[i] = (grown, prompt)
        elif op < 0.8:
            i = rng.randrange(len(live))
            allocation, prompt = live[i]
            live[i] = (cache.release(allocation, rng.randrange(len(allocation.blocks))), prompt)
        else:
            allocation, prompt = live.pop(rng.randrange(len(live)))
            cache.free(allocation, prompt if rng.random() < 0.7 else None)
        cache.check_integrity()
    for allocation, _ in live:
        cache.free(allocation, None)
    cache.check_integrity()
    assert cache.used_blocks == 0 and cache.free_blocks + cache.cached_blocks == 39


def test_the_budget_split_keeps_one_sequence_in_each_group_and_the_window_share() -> None:
    assert hybrid_window([None, 8, None, 16]) == 16
    assert hybrid_window([8, 8]) is None and hybrid_window([None, None]) is None
    # 5 local layers : 1 global, equal bytes per layer: a local block costs 5x a global one.
    shape = GroupShape(global_block_bytes=100, local_block_bytes=500, window=64)
    global_blocks, local_blocks = split_blocks(budget=600_000, shape=shape, block_size=16, reference_len=1024)
    keep = 64 + 2 * 16
    assert local_blocks == local_blocks_for(global_blocks, 64, 16, 1024)
    assert local_blocks - 1 == -(-(global_blocks - 1) * keep // 1024)  # the window's share of the positions
    assert global_blocks * 100 + local_blocks * 500 <= 600_000
    assert (global_blocks + 1) * 100 + local_blocks_for(global_blocks + 1, 64, 16, 1024) * 500 > 600_000
    # Keeping everything the same bytes hold 1,000 blocks; the split holds ~3x as many positions.
    assert global_blocks > 3 * 1000
    tiny = split_blocks(budget=9_000, shape=shape, block_size=16, reference_len=1024)
    assert tiny == (0, 0)  # not one sequence of 1,024 positions in the local group
