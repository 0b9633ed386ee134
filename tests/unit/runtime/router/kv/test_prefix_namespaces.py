"""The radix cache keyed by LoRA adapter: one root per namespace, one LRU over all of them."""

from __future__ import annotations

import pytest

from tgictl.errors import AllocatorError
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator

PROMPT = tuple(range(100, 133))  # 33 tokens: two full blocks of 16 are cacheable (the last is never)


def _serve(cache: RadixAllocator, namespace: int) -> int:
    """Allocate the prompt under `namespace`, compute it, free it; returns the cached prefix it found."""
    allocation = cache.allocate(len(PROMPT) + 4, PROMPT[:-1], namespace)
    assert allocation is not None
    cache.check_integrity()
    cache.free(allocation, PROMPT)
    cache.check_integrity()
    return allocation.prefix_len


def test_the_same_prompt_under_two_adapters_never_shares_kv() -> None:
    cache = RadixAllocator(num_blocks=32, block_size=16)
    assert _serve(cache, 0) == 0
    assert _serve(cache, 1) == 0  # adapter 1 must not read the base model's KV
    assert _serve(cache, 2) == 0
    assert _serve(cache, 1) == 32  # but its own, yes
    assert _serve(cache, 0) == 32
    assert cache.cached_blocks == 3 * 2


def test_eviction_is_one_lru_over_every_adapter() -> None:
    cache = RadixAllocator(num_blocks=8, block_size=16)  # 7 usable blocks
    _serve(cache, 1)  # 2 cached blocks under adapter 1, the oldest
    _serve(cache, 2)
    _serve(cache, 3)
    assert cache.cached_blocks == 6
    big = cache.allocate(16 * 3, None, 0)  # needs 3 blocks: 1 free + 2 evicted from the oldest
    assert big is not None
    cache.check_integrity()
    assert _serve(cache, 2) == 32 and cache.trie.find(PROMPT[:-1], 1)[1] == []
    cache.free(big, None)
    cache.check_integrity()


def test_an_unloaded_adapters_prefixes_are_forgotten_and_its_blocks_freed() -> None:
    cache = RadixAllocator(num_blocks=32, block_size=16)
    for namespace in (0, 1, 2):
        _serve(cache, namespace)
    longer = PROMPT + tuple(range(200, 216))  # a child node under adapter 1's cached prefix
    allocation = cache.allocate(len(longer) + 2, longer[:-1], 1)
    assert allocation is not None and allocation.prefix_len == 32
    cache.free(allocation, longer)
    free = cache.free_blocks
    cache.forget(1)
    cache.check_integrity()
    assert cache.free_blocks == free + 3 and cache.cached_blocks == 4
    assert _serve(cache, 1) == 0  # a new adapter in slot 1 computes its own KV
    assert _serve(cache, 2) == 32 and _serve(cache, 0) == 32  # the others' prefixes stay
    cache.forget(0)  # the base model's are never dropped
    assert _serve(cache, 0) == 32


def test_an_adapter_in_use_cannot_be_forgotten() -> None:
    cache = RadixAllocator(num_blocks=32, block_size=16)
    _serve(cache, 1)
    allocation = cache.allocate(len(PROMPT) + 4, PROMPT[:-1], 1)
    assert allocation is not None
    with pytest.raises(AllocatorError, match="in use"):
        cache.forget(1)
    cache.check_integrity()
    cache.free(allocation, PROMPT)
    cache.forget(1)
    cache.check_integrity()
