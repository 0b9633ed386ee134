"""BlockAllocator (TGI's SimpleAllocator) exactly, and the contract both allocators share."""

from __future__ import annotations

import pytest

from tgictl.errors import AllocatorError, AllocatorIntegrityError, ConfigError
from tgictl.runtime.router.kv.block_allocator import (
    BlockAllocation,
    BlockAllocator,
    KvAllocator,
)
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator, create_allocator

BOTH = [BlockAllocator, RadixAllocator]


def test_takes_the_last_blocks_of_the_free_list() -> None:
    alloc = BlockAllocator(10, 2)
    a = alloc.allocate(5, [0, 1, 2])
    alloc.check_integrity()
    assert a == BlockAllocation(1, (7, 8, 9), 5, prefix_len=0)
    b = alloc.allocate(4, None)
    alloc.check_integrity()
    assert (b.allocation_id, b.blocks, b.tokens) == (2, (5, 6), 4)
    assert (alloc.used_blocks, alloc.free_blocks, alloc.cached_blocks) == (5, 4, 0)


def test_free_is_lifo() -> None:
    alloc = BlockAllocator(10, 1)
    a = alloc.allocate(3, None)
    b = alloc.allocate(2, None)
    assert (a.blocks, b.blocks) == ((7, 8, 9), (5, 6))
    alloc.free(a, None)
    alloc.check_integrity()
    c = alloc.allocate(2, None)  # the most recently freed blocks come back first
    assert c.blocks == (8, 9)
    alloc.free(b, None)
    alloc.free(c, [1, 2])  # computed tokens change nothing without a cache
    alloc.check_integrity()
    assert alloc._free == [1, 2, 3, 4, 7, 5, 6, 8, 9]
    assert alloc.allocate(2, [1, 2]).prefix_len == 0


def test_none_when_full_and_block_zero_never_given() -> None:
    alloc = BlockAllocator(5, 4)
    assert alloc.allocate(17, None) is None  # 5 blocks, 4 usable
    a = alloc.allocate(16, None)
    assert a.blocks == (1, 2, 3, 4) and a.tokens == 16
    assert alloc.allocate(1, None) is None
    assert alloc.free_blocks == 0 and alloc.used_blocks == 4
    alloc.check_integrity()


def test_zero_tokens_take_no_blocks() -> None:
    alloc = BlockAllocator(5, 4)
    a = alloc.allocate(0, [])
    assert (a.blocks, a.tokens, alloc.free_blocks) == ((), 0, 4)
    alloc.free(a, None)
    alloc.check_integrity()


def test_check_integrity_detects_corruption() -> None:
    alloc = BlockAllocator(6, 1)
    a = alloc.allocate(2, None)
    alloc._free.append(a.blocks[0])
    with pytest.raises(AllocatorIntegrityError, match=f"block {a.blocks[0]} is owned twice"):
        alloc.check_integrity()
    alloc._free.pop()
    alloc._free.pop()
    with pytest.raises(AllocatorIntegrityError, match="leaked"):
        alloc.check_integrity()


@pytest.mark.parametrize("cls", BOTH)
def test_shared_contract(cls: type[KvAllocator]) -> None:
    alloc = cls(9, 2)
    assert isinstance(alloc, KvAllocator)
    assert (alloc.block_size, alloc.total_blocks, alloc.free_blocks) == (2, 8, 8)
    allocations = []
    while (a := alloc.allocate(3, [1, 2, 3])) is not None:
        alloc.check_integrity()
        assert 0 not in a.blocks and a.tokens == 3 and len(a.blocks) == 2
        allocations.append(a)
    alloc.check_integrity()
    assert alloc.num_allocations == len(allocations)
    owned = [b for a in allocations for b in a.blocks[a.prefix_len // 2 :]]
    assert len(owned) == len(set(owned))
    assert alloc.used_blocks + alloc.cached_blocks + alloc.free_blocks == 8
    for a in allocations:
        alloc.free(a, [1, 2, 3])
        alloc.check_integrity()
    with pytest.raises(AllocatorError, match="is not live"):
        alloc.free(allocations[0], None)
    assert alloc.used_blocks == 0 and alloc.num_allocations == 0
    everything = alloc.allocate(16, None)
    assert sorted(everything.blocks) == list(range(1, 9))
    alloc.check_integrity()


@pytest.mark.parametrize("cls", BOTH)
def test_bad_shapes_are_config_errors(cls: type[KvAllocator]) -> None:
    with pytest.raises(ConfigError, match="block_size must be >= 1, got 0"):
        cls(10, 0)
    with pytest.raises(ConfigError, match="num_blocks must be >= 1"):
        cls(0, 16)
    only_reserved = cls(1, 16)
    assert only_reserved.total_blocks == 0
    assert only_reserved.allocate(1, None) is None
    only_reserved.check_integrity()


@pytest.mark.parametrize("cls", BOTH)
def test_foreign_allocation_is_rejected(cls: type[KvAllocator]) -> None:
    alloc = cls(9, 1)
    a = alloc.allocate(2, None)
    forged = BlockAllocation(a.allocation_id, (1, 2), 2, 0)
    with pytest.raises(AllocatorError, match=f"allocation {a.allocation_id} is not live"):
        alloc.free(forged, None)
    alloc.check_integrity()


def test_factory_picks_the_allocator() -> None:
    assert type(create_allocator(10, 16, prefix_caching=True)) is RadixAllocator
    assert type(create_allocator(10, 16, prefix_caching=False)) is BlockAllocator
