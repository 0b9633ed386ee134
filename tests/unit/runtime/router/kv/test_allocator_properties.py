"""Randomized checks of the allocators: TGI's seeded invariant runs (radix.rs tests 13-14) and
Hypothesis properties against a model of the prefix cache, over allocations that grow as their
requests generate. check_integrity runs after every Hypothesis operation."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tgictl.errors import AllocatorError
from tgictl.runtime.router.kv.block_allocator import (
    BlockAllocation,
    BlockAllocator,
    KvAllocator,
    blocks_for,
)
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator

# -- TGI's seeded invariant runs: 100,000 rounds in total over the two variants ---------------


def _invariant_rounds(rounds: int, remove_all: bool) -> int:
    """bs 1, 100 blocks, vocab {0, 1}, prompts are slices (length 0..7) of a 1000-token corpus
    plus 0..7 decode tokens. Each round allocates until failure, checks the invariants, then
    frees everything or a random 20%. Returns how many allocations were made."""
    rng = random.Random(64)
    rand = rng.random  # int(rand() * n) instead of randrange: this loop is the test's whole cost
    corpus = [int(rand() * 2) for _ in range(1000)]
    cache = RadixAllocator(100, 1)
    live: list[tuple[BlockAllocation, list[int]]] = []
    made = 0
    for round_ in range(rounds):
        while True:
            prompt_len = int(rand() * 8)
            start = int(rand() * (1001 - prompt_len))
            prompt = corpus[start : start + prompt_len]
            allocation = cache.allocate(prompt_len + int(rand() * 8), prompt)
            if allocation is None:
                break
            blocks = allocation.blocks  # never change, so checking them once is enough
            if 0 in blocks or len(set(blocks)) != len(blocks):
                pytest.fail(f"round {round_}: bad blocks {blocks}")
            live.append((allocation, prompt))
            made += 1
        owned = [b for a, _ in live for b in a.blocks[a.prefix_len :]]
        if len(set(owned)) != len(owned):
            pytest.fail(f"round {round_}: non-prefix blocks shared between live allocations")
        if cache.used_blocks + cache.cached_blocks + cache.free_blocks != 99:
            pytest.fail(f"round {round_}: block counts do not add up")
        if round_ % 1000 == 0:
            cache.check_integrity()
        if not remove_all:
            # A random 20% goes to the end (partial Fisher-Yates: cheaper than a full shuffle).
            n = len(live)
            for i in range(n - 1, int(n * 0.8) - 1, -1):
                j = int(rand() * (i + 1))
                live[i], live[j] = live[j], live[i]
        keep = 0 if remove_all else int(len(live) * 0.8)
        for allocation, prompt in live[keep:]:
            # Mostly the whole prompt (TGI's behaviour); sometimes a chunk or nothing computed.
            roll = rand()
            if roll < 0.85:
                computed: list[int] | None = prompt
            else:
                computed = None if roll > 0.95 else prompt[: int(roll * 100) % 8]
            cache.free(allocation, computed)
        del live[keep:]
    cache.check_integrity()
    return made


def test_invariants_hold_on_many_operations_remove_all() -> None:
    assert _invariant_rounds(50_000, remove_all=True) > 500_000


def test_invariants_hold_on_many_operations_remove_subset() -> None:
    assert _invariant_rounds(50_000, remove_all=False) > 100_000


# -- Hypothesis: any allocate/grow/free sequence keeps the books straight ---------------------

# alloc: the prompt, extra tokens beyond it, and the blocks that must stay available afterwards (reserve).
_ALLOC = st.tuples(st.just("alloc"), st.lists(st.integers(0, 2), max_size=10), st.integers(0, 6), st.integers(0, 3))
# grow: which live allocation, and how many more tokens it generated (the allocation grows to hold them).
_GROW = st.tuples(st.just("grow"), st.integers(0, 1_000), st.integers(1, 7))
# free: which live allocation, and how much of its sequence (prompt + generated) was computed (-1: all of it).
_FREE = st.tuples(st.just("free"), st.integers(0, 1_000), st.integers(-1, 11))
_OPS = st.lists(st.one_of(_ALLOC, _GROW, _FREE), max_size=40)
Live = list[tuple[BlockAllocation, list[int]]]  # each live allocation with its sequence so far


def _grow(alloc: KvAllocator, live: Live, index: int, more: int) -> tuple[BlockAllocation, BlockAllocation | None]:
    """Grow live[index] by `more` generated tokens: on success it replaces the old record, whose allocation
    is then stale (every later call with it is refused); on failure nothing changes."""
    allocation, sequence = live[index]
    before = (alloc.used_blocks, alloc.cached_blocks, alloc.free_blocks)
    need = blocks_for(allocation.tokens + more, alloc.block_size) - len(allocation.blocks)
    grown = alloc.grow(allocation, allocation.tokens + more)
    # It fails exactly when neither the free list nor evicting cached prefixes can supply the blocks.
    assert (grown is None) == (need > before[1] + before[2])
    if grown is None:
        assert (alloc.used_blocks, alloc.cached_blocks, alloc.free_blocks) == before
        return allocation, None
    assert grown.allocation_id == allocation.allocation_id and grown.prefix_len == allocation.prefix_len
    assert grown.blocks[: len(allocation.blocks)] == allocation.blocks  # blocks only ever join at the end
    assert len(grown.blocks) == blocks_for(grown.tokens, alloc.block_size) and grown.tokens == allocation.tokens + more
    live[index] = (grown, sequence + [index % 3] * more)
    if grown.blocks != allocation.blocks:
        with pytest.raises(AllocatorError, match="not live"):
            alloc.free(allocation, None)
    return allocation, grown


def _check_books(alloc: KvAllocator, live: Sequence[tuple[BlockAllocation, list[int]]]) -> None:
    alloc.check_integrity()
    assert alloc.used_blocks + alloc.cached_blocks + alloc.free_blocks == alloc.total_blocks
    bs = alloc.block_size
    owned = [b for a, _ in live for b in a.blocks[a.prefix_len // bs :]]
    assert len(owned) == len(set(owned)), "a block is owned by two live allocations"
    assert 0 not in {b for a, _ in live for b in a.blocks}
    assert alloc.num_allocations == len(live)


def _computed(prompt: list[int], how: int) -> list[int] | None:
    if how == -1:
        return prompt
    return None if how == 0 else prompt[:how]


def _drain_and_take_everything(
    alloc: KvAllocator, live: list[tuple[BlockAllocation, list[int]]]
) -> None:
    """After everything is freed, one allocation of all usable blocks succeeds (evicting the
    whole cache) and gets every block exactly once."""
    for allocation, prompt in live:
        alloc.free(allocation, prompt)
        alloc.check_integrity()
    live.clear()
    assert alloc.used_blocks == 0
    assert alloc.cached_blocks + alloc.free_blocks == alloc.total_blocks
    everything = alloc.allocate(alloc.total_blocks * alloc.block_size, None)
    alloc.check_integrity()
    assert everything is not None
    assert sorted(everything.blocks) == list(range(1, alloc.total_blocks + 1))
    assert (alloc.used_blocks, alloc.cached_blocks, alloc.free_blocks) == (alloc.total_blocks, 0, 0)
    alloc.free(everything, None)
    alloc.check_integrity()
    assert alloc.free_blocks == alloc.total_blocks


@pytest.mark.parametrize("cls", [BlockAllocator, RadixAllocator])
@settings(max_examples=150, deadline=None)
@given(block_size=st.integers(1, 3), num_blocks=st.integers(1, 24), ops=_OPS)
def test_any_sequence_keeps_the_books(
    cls: type[KvAllocator], block_size: int, num_blocks: int, ops: list[tuple]
) -> None:
    alloc = cls(num_blocks, block_size)
    live: Live = []
    for op in ops:
        if op[0] == "alloc":
            _, prompt, extra, reserve = op
            before = (alloc.used_blocks, alloc.cached_blocks, alloc.free_blocks)
            allocation = alloc.allocate(len(prompt) + extra, prompt, reserve=reserve)
            if allocation is None:
                assert (alloc.used_blocks, alloc.cached_blocks, alloc.free_blocks) == before
            else:
                assert allocation.tokens == len(prompt) + extra
                assert len(allocation.blocks) == blocks_for(allocation.tokens, block_size)
                assert alloc.free_blocks + alloc.cached_blocks >= reserve  # the watermark held
                live.append((allocation, prompt))
        elif op[0] == "grow" and live:
            _grow(alloc, live, op[1] % len(live), op[2])
        elif op[0] == "free" and live:
            _, index, how = op
            allocation, prompt = live.pop(index % len(live))
            alloc.free(allocation, _computed(prompt, how))
        _check_books(alloc, live)
    _drain_and_take_everything(alloc, live)


class _CacheModel:
    """What the prefix cache must hold: every cached block-aligned prompt prefix -> the block
    with its last block_size tokens. Prefix-closed, like the trie (eviction takes leaves)."""

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.blocks: dict[tuple[int, ...], int] = {}

    def lookup(self, prompt: list[int]) -> list[int]:
        hit: list[int] = []
        for end in range(self.bs, len(prompt) + 1, self.bs):
            block = self.blocks.get(tuple(prompt[:end]))
            if block is None:
                break
            hit.append(block)
        return hit

    def publish(self, computed: list[int] | None, blocks: Sequence[int]) -> None:
        computed = computed or []
        for i, end in enumerate(range(self.bs, len(computed) + 1, self.bs)):
            self.blocks.setdefault(tuple(computed[:end]), blocks[i])  # present: ours is a duplicate

    def evicted(self, fresh: Sequence[int]) -> None:
        # Eviction happens only when it makes an allocation fit, and every evicted block is
        # then handed out: the blocks of evicted prefixes are exactly among the fresh ones.
        gone = set(fresh)
        self.blocks = {k: b for k, b in self.blocks.items() if b not in gone}


@settings(max_examples=300, deadline=None)
@given(block_size=st.integers(1, 3), num_blocks=st.integers(1, 24), ops=_OPS)
def test_radix_cache_returns_the_published_blocks(
    block_size: int, num_blocks: int, ops: list[tuple]
) -> None:
    cache = RadixAllocator(num_blocks, block_size)
    model = _CacheModel(block_size)
    live: Live = []
    for op in ops:
        if op[0] == "alloc":
            _, prompt, extra, reserve = op
            expected = model.lookup(prompt)
            need = -(-(len(prompt) + extra - len(expected) * block_size) // block_size)
            free_before, cached_before = cache.free_blocks, cache.cached_blocks
            allocation = cache.allocate(len(prompt) + extra, prompt, reserve=reserve)
            if allocation is None:
                assert need + reserve > free_before  # never fails while the free list suffices, watermark kept
            else:
                assert need + reserve <= free_before + cached_before
                # A cached prefix comes back as the very blocks that were published.
                assert allocation.prefix_len == len(expected) * block_size
                assert list(allocation.blocks[: len(expected)]) == expected
                assert len(allocation.blocks) == len(expected) + need
                fresh = allocation.blocks[len(expected) :]
                assert not set(fresh) & {b for a, _ in live for b in a.blocks}
                model.evicted(fresh)
                live.append((allocation, prompt))
        elif op[0] == "grow" and live:
            old, grown = _grow(cache, live, op[1] % len(live), op[2])
            if grown is not None:
                fresh = grown.blocks[len(old.blocks) :]
                assert not set(fresh) & {b for a, _ in live if a is not grown for b in a.blocks}
                model.evicted(fresh)  # a grown allocation's new blocks may come from the cache
        elif op[0] == "free" and live:
            _, index, how = op
            allocation, prompt = live.pop(index % len(live))
            computed = _computed(prompt, how)
            cache.free(allocation, computed)
            model.publish(computed, allocation.blocks)
        _check_books(cache, live)
        assert cache.trie.num_blocks == len(model.blocks)
    _drain_and_take_everything(cache, live)
