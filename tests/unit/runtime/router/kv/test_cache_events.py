"""The radix cache's changes as vLLM KV events: what a stored prefix and an eviction emit, and, over
random workloads, that a consumer applying the events holds exactly what the cache holds."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tgictl.runtime.router.kv.cache_events import KvEventLog, block_hash
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator


def _cache(num_blocks: int, block_size: int) -> tuple[RadixAllocator, list[list[Any]]]:
    events: list[list[Any]] = []
    log = KvEventLog(block_size, events.extend)
    return RadixAllocator(num_blocks, block_size, log), events


def _serve(cache: RadixAllocator, prompt: list[int], namespace: int = 0) -> None:
    allocation = cache.allocate(len(prompt) + 1, prompt, namespace)
    assert allocation is not None
    cache.free(allocation, prompt)


def test_a_stored_prefix_chains_to_the_blocks_before_it() -> None:
    cache, events = _cache(16, 2)
    _serve(cache, [1, 2, 3, 4, 5])  # two whole blocks: (1, 2), (3, 4)
    (stored,) = events
    first, second = block_hash(None, 0, [1, 2]), block_hash(block_hash(None, 0, [1, 2]), 0, [3, 4])
    # vLLM's BlockStored as msgspec's array_like tagged struct.
    assert stored == ["BlockStored", [first, second], None, [1, 2, 3, 4], 2, None, None]
    events.clear()
    _serve(cache, [1, 2, 3, 4, 9, 9, 7])  # the cached two blocks, then (9, 9)
    assert events == [["BlockStored", [block_hash(second, 0, [9, 9])], second, [9, 9], 2, None, None]]
    events.clear()
    _serve(cache, [1, 2, 3, 4, 0])  # nothing new
    assert events == []


def test_an_adapter_s_prefix_has_its_own_hashes_and_lora_id() -> None:
    cache, events = _cache(16, 2)
    _serve(cache, [1, 2, 3], namespace=2)
    assert events == [["BlockStored", [block_hash(None, 2, [1, 2])], None, [1, 2], 2, 2, None]]
    assert block_hash(None, 2, [1, 2]) != block_hash(None, 0, [1, 2])


def test_eviction_removes_the_hashes_that_were_stored() -> None:
    cache, events = _cache(6, 2)  # 5 usable blocks
    _serve(cache, [1, 2, 3, 4, 5])
    stored = events[0][1]
    events.clear()
    _serve(cache, [7, 7, 8, 8, 9, 9, 0, 0, 1])  # needs all 5 blocks: evicts the first prompt's two
    assert events[0][0] == "BlockRemoved" and events[0][2] is None and set(events[0][1]) == set(stored)
    assert events[1][0] == "BlockStored"


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 4))
def test_a_consumer_of_the_events_holds_what_the_cache_holds(seed: int, block_size: int) -> None:
    rng = random.Random(seed)
    cache, events = _cache(24, block_size)
    held: set[int] = set()
    documents = [[rng.randrange(50) for _ in range(rng.randrange(1, 20))] for _ in range(4)]
    for _ in range(40):
        prompt = rng.choice(documents) + [rng.randrange(50) for _ in range(rng.randrange(0, 8))]
        allocation = cache.allocate(len(prompt) + rng.randrange(1, 4), prompt, rng.choice((0, 0, 1)))
        if allocation is None:
            continue
        computed = prompt[: rng.randrange(len(prompt) + 1)]
        cache.free(allocation, computed)
        for event in events:
            if event[0] == "BlockStored":
                assert not held & set(event[1])
                assert event[2] is None or event[2] in held  # the parent is one the consumer knows
                held |= set(event[1])
            elif event[0] == "BlockRemoved":
                assert set(event[1]) <= held
                held -= set(event[1])
        events.clear()
        cache.check_integrity()
        assert len(held) == cache.trie.num_blocks
