"""`release`: the leading blocks every sliding-window layer has left behind go back to the pool, for both
allocators, without publishing a sequence whose first blocks are gone (docs/scheduling.md, "Sliding windows")."""

from __future__ import annotations

import pytest

from tgictl.errors import AllocatorError
from tgictl.runtime.router.kv.block_allocator import BlockAllocator, KvAllocator
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator
from tgictl.runtime.router.scheduling.scheduler import release_window

BOTH = [BlockAllocator, RadixAllocator]


@pytest.mark.parametrize("cls", BOTH)
def test_released_blocks_are_free_and_the_rest_stays_owned(cls: type[KvAllocator]) -> None:
    cache = cls(11, 4)  # 10 usable blocks of 4
    prompt = list(range(1, 13))
    grown = cache.grow(cache.allocate(12, prompt), 24)  # 6 blocks: the prompt's 3, 3 more as it generated
    assert grown is not None and cache.free_blocks == 4
    released = cache.release(grown, 4)
    cache.check_integrity()
    assert released.released == 4 and released.blocks == grown.blocks  # block i still holds positions 4i..
    assert cache.free_blocks == 8 and cache.used_blocks == 2
    assert set(grown.blocks[:4]) <= set(cache._free)  # type: ignore[attr-defined]
    assert cache.release(released, 2) is released  # fewer than already released: nothing changes
    with pytest.raises(AllocatorError, match="not live"):
        cache.release(grown, 5)  # the stale record from before the release
    with pytest.raises(AllocatorError, match="keeps its last"):
        cache.release(released, 6)
    later = cache.grow(released, 28)  # it still grows at its end
    assert later is not None and later.released == 4 and len(later.blocks) == 7
    cache.free(later, prompt + list(range(100, 115)))
    cache.check_integrity()
    assert cache.free_blocks == 10 and cache.num_allocations == 0


def test_a_sequence_that_released_blocks_is_not_published_but_its_cached_prefix_stays() -> None:
    """The radix cache holds sequences from their first token: once blocks behind the window are gone, the
    request's tokens are not published (a later request with the same prompt, or a continuation, computes
    them again); a cached prefix it was admitted with is the trie's, never released, and stays cached."""
    cache = RadixAllocator(21, 4)
    prefix = list(range(1, 9))  # 2 blocks
    first = cache.allocate(9, prefix + [50])
    assert first is not None
    cache.free(first, prefix + [50])  # publishes the 2 whole blocks
    assert cache.cached_blocks == 2
    prompt = prefix + [60, 61, 62, 63, 64]
    second = cache.allocate(13, prompt)
    assert second is not None and second.prefix_len == 8
    grown = cache.grow(second, 32)
    assert grown is not None
    released = cache.release(grown, 5)  # the 2 cached blocks stay pinned in the trie; 3 of its own go back
    cache.check_integrity()
    assert cache.used_blocks == 2 + 3 and cache.free_blocks == 20 - 5
    cache.free(released, prompt + list(range(70, 89)))
    cache.check_integrity()
    assert cache.cached_blocks == 2  # only the earlier prefix: nothing of the released sequence was published
    again = cache.allocate(13, prompt)
    assert again is not None and again.prefix_len == 8


def test_a_release_behind_the_cached_prefix_only_publishes_as_before() -> None:
    """Releasing only cached prefix blocks frees nothing and breaks no chain: free publishes as without it."""
    cache = RadixAllocator(21, 4)
    prefix = list(range(1, 9))
    first = cache.allocate(9, prefix + [50])
    assert first is not None
    cache.free(first, prefix + [50])
    prompt = prefix + [60, 61, 62, 63, 64]
    second = cache.allocate(16, prompt)
    assert second is not None
    released = cache.release(second, 2)
    assert cache.used_blocks == 4
    cache.free(released, prompt)
    cache.check_integrity()
    assert cache.cached_blocks == 3  # the prompt's third whole block was published


def test_release_window_needs_a_window_on_every_layer() -> None:
    assert release_window((4096, 4096, 2048)) == 2048  # Mistral-like: every layer windowed
    assert release_window((4096, 0, 4096, 0)) is None  # Gemma 2/3: a global layer needs every position
    assert release_window(()) is None  # full attention everywhere
