"""The free lists every allocator draws from (kv/block_allocator.py, kv/prefix_allocator.py): blocks 1..num_blocks-1
(block 0 is reserved for health probes), and with two layer groups (tgictl/kv_groups.py) a free list per group whose
blocks are handed out as (global, local) pair ids. Also the ownership check both allocators' check_integrity uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tgictl.errors import AllocatorIntegrityError, ConfigError
from tgictl.kv_groups import KvGroups


def check_allocator_shape(num_blocks: int, block_size: int) -> None:
    """Constructor arguments shared by every allocator."""
    if block_size < 1:
        raise ConfigError(f"block_size must be >= 1, got {block_size}")
    if num_blocks < 1:
        raise ConfigError(f"num_blocks must be >= 1 (block 0 is reserved), got {num_blocks}")


def check_block_ownership(
    num_blocks: int, owners: Iterable[tuple[str, Iterable[int]]]
) -> None:
    """Every usable block 1..num_blocks-1 must belong to exactly one owner; block 0 to none."""
    seen: dict[int, str] = {}
    for owner, blocks in owners:
        for block in blocks:
            if not 0 < block < num_blocks:
                raise AllocatorIntegrityError(
                    f"{owner} holds block {block}, outside 1..{num_blocks - 1}"
                )
            if block in seen:
                raise AllocatorIntegrityError(
                    f"block {block} is owned twice: {seen[block]} and {owner}"
                )
            seen[block] = owner
    if len(seen) != num_blocks - 1:
        missing = sorted(set(range(1, num_blocks)) - seen.keys())
        raise AllocatorIntegrityError(f"blocks leaked (owned by nobody): {missing[:20]}")


class BlockPool:
    """What both allocators share: the checked shape and the free list `1..num_blocks-1` (block 0
    is reserved), one per layer group when `groups` is given (then `num_blocks` global blocks of the router's
    budget, at most groups.global_blocks, and all of groups.local_blocks). Allocations take the LAST blocks of
    the list and freed (or evicted) blocks are appended, so the most recently freed blocks are reused first
    (TGI's order)."""

    def __init__(self, num_blocks: int, block_size: int, groups: KvGroups | None = None) -> None:
        check_allocator_shape(num_blocks, block_size)
        if groups is not None and num_blocks > groups.global_blocks:
            raise ConfigError(f"{num_blocks} global blocks exceed the {groups.global_blocks} the shards hold")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._groups = groups
        self._free: list[int] = list(range(1, num_blocks))
        self._local_free: list[int] = list(range(1, groups.local_blocks)) if groups is not None else []

    def _available(self) -> int:
        """Blocks (pairs, with two groups) that `_take` can hand out now."""
        if self._groups is None:
            return len(self._free)
        return min(len(self._free), len(self._local_free))

    def _take(self, count: int) -> tuple[int, ...]:
        """The last `count` blocks of the free list(s) (the caller checked `_available`)."""
        if not count:  # free[-0:] would be the whole list
            return ()
        blocks = self._free[-count:]
        del self._free[-count:]
        if self._groups is None:
            return tuple(blocks)
        local = self._local_free[-count:]
        del self._local_free[-count:]
        return tuple(map(self._groups.pair, blocks, local))

    def _give(self, blocks: Sequence[int]) -> None:
        """Whole blocks (both halves of pairs) back to the free list(s)."""
        if self._groups is None:
            self._free.extend(blocks)
            return
        split = self._groups.split
        for block in blocks:
            global_block, local_block = split(block)
            self._free.append(global_block)
            self._local_free.append(local_block)

    def _give_owned(self, blocks: Sequence[int], owned_from: int, released: int) -> None:
        """What an allocation owns of `blocks` back to the free lists: blocks[owned_from:] whole, and with two
        groups the global halves of the released blocks after owned_from too."""
        start = max(owned_from, released)
        self._give(blocks[start:])
        if self._groups is not None:
            self._free.extend(self._groups.split(block)[0] for block in blocks[owned_from:start])

    def _release_owned(self, blocks: Sequence[int]) -> int:
        """Released blocks an allocation owned back to the pool; returns how many (global) blocks it no longer
        owns: all of them with one group, none with two (only the local halves go back)."""
        if self._groups is None:
            self._free.extend(blocks)
            return len(blocks)
        self._local_free.extend(self._groups.split(block)[1] for block in blocks)
        return 0

    def _check_owners(self, owners: list[tuple[str, Sequence[int], int]]) -> None:
        """Every block of every group belongs to exactly one owner. `owners`: (name, its blocks, from which of
        them it also owns the local halves); the free lists are added here."""
        groups = self._groups
        if groups is None:
            check_block_ownership(self._num_blocks, [("free list", self._free)] + [
                (name, blocks) for name, blocks, _ in owners
            ])
            return
        check_block_ownership(self._num_blocks, [("free list", self._free)] + [
            (name, [groups.split(b)[0] for b in blocks]) for name, blocks, _ in owners
        ])
        check_block_ownership(groups.local_blocks, [("local free list", self._local_free)] + [
            (f"{name} (local)", [groups.split(b)[1] for b in blocks[local_from:]]) for name, blocks, local_from in owners
        ])

    @property
    def groups(self) -> KvGroups | None:
        return self._groups

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def total_blocks(self) -> int:
        return self._num_blocks - 1

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def local_free_blocks(self) -> int | None:
        """The local group's free blocks (None with one group)."""
        return len(self._local_free) if self._groups is not None else None
