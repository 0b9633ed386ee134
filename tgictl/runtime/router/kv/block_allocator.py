"""KV-cache block allocation for the router: the interface every allocator implements, the
allocation record the queue keeps per entry, and the plain allocator used without prefix caching.

The router owns shard memory (docs/architecture.md, "Decisions": The router owns memory): every request gets its blocks here, for the whole
`input + max_new_tokens + speculate - 1` budget up front, when the queue admits it. Block 0 is
reserved for health probes and never handed out. A slot is `block * block_size + offset`
(docs/architecture.md, "Memory model"), so an allocation's slots follow from its blocks.

Allocators are not thread-safe: the batcher owns one and calls it from a single task.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tgictl.errors import AllocatorError, AllocatorIntegrityError, ConfigError


@dataclass(frozen=True)
class BlockAllocation:
    """Blocks and slots handed to one queue entry. Pass it back to `free` exactly once."""

    allocation_id: int  # unique per allocator, starts at 1
    blocks: tuple[int, ...]  # [ceil(tokens / block_size)] block ids, cached prefix blocks first
    slots: tuple[int, ...]  # [tokens] KV slots, slot = block * block_size + offset
    # Leading prompt tokens whose KV is already in `blocks` (a multiple of block_size; 0 without
    # prefix caching). May equal the prompt length: the queue reduces it by one, not the allocator.
    prefix_len: int

    @property
    def tokens(self) -> int:
        """The token budget this allocation was made for."""
        return len(self.slots)


@runtime_checkable
class KvAllocator(Protocol):
    """What the queue needs from an allocator. Counts are in blocks; block 0 is not counted."""

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        ...

    @property
    def prefix_caching(self) -> bool:
        """Whether `allocate` can return a non-zero `prefix_len` (a prompt key is worth passing)."""
        ...

    @property
    def total_blocks(self) -> int:
        """Usable blocks: num_blocks - 1. Always used + cached + free."""
        ...

    @property
    def free_blocks(self) -> int:
        """Blocks on the free list, immediately allocatable."""
        ...

    @property
    def cached_blocks(self) -> int:
        """Blocks held only by the prefix cache: evictable on demand, not pinned by anyone."""
        ...

    @property
    def used_blocks(self) -> int:
        """Blocks held by live allocations, including cached prefix blocks they pin."""
        ...

    @property
    def num_allocations(self) -> int:
        """Live (allocated, not yet freed) allocations."""
        ...

    def allocate(
        self, tokens: int, prefill_tokens: Sequence[int] | None, namespace: int = 0
    ) -> BlockAllocation | None:
        """Blocks for `tokens` KV entries; `prefill_tokens` (the prompt ids, or None to skip the
        cache) is the prefix-cache key within `namespace` (the LoRA adapter index: the same ids under
        two adapters have different KV). None when the blocks do not fit; then nothing stays
        pinned or taken."""
        ...

    def free(self, allocation: BlockAllocation, computed_tokens: Sequence[int] | None) -> None:
        """Give `allocation` back. `computed_tokens` are the leading prompt ids whose KV was
        actually written (None or empty: never prefilled); only their full blocks may be cached."""
        ...

    def forget(self, namespace: int) -> None:
        """Drop what is cached under `namespace` (an unloaded LoRA adapter's index): its KV is stale."""
        ...

    def check_integrity(self) -> None:
        """Recompute all bookkeeping from scratch; raise AllocatorIntegrityError on any mismatch."""
        ...


def check_allocator_shape(num_blocks: int, block_size: int) -> None:
    """Constructor arguments shared by every allocator."""
    if block_size < 1:
        raise ConfigError(f"block_size must be >= 1, got {block_size}")
    if num_blocks < 1:
        raise ConfigError(f"num_blocks must be >= 1 (block 0 is reserved), got {num_blocks}")


def check_allocate_args(tokens: int, prefill_tokens: Sequence[int] | None) -> None:
    if tokens < 0:
        raise AllocatorError(f"allocate: tokens must be >= 0, got {tokens}")
    if prefill_tokens is not None and len(prefill_tokens) > tokens:
        # The prompt's own KV must fit in the allocation, or a cached prefix could exceed it.
        raise AllocatorError(
            f"allocate: {len(prefill_tokens)} prefill tokens exceed the budget of {tokens} tokens"
        )


def check_computed_tokens(
    allocation: BlockAllocation, computed: tuple[int, ...], prompt: tuple[int, ...] | None
) -> None:
    """`computed` must fit the allocation and, when a prompt key was given, agree with it where both
    exist: a prefix of the prompt, or the prompt followed by generated tokens (a continuation round
    publishes those). Anything else would publish blocks under tokens whose KV they do not hold."""
    if len(computed) > allocation.tokens:
        raise AllocatorError(
            f"free: {len(computed)} computed tokens exceed allocation {allocation.allocation_id}'s "
            f"budget of {allocation.tokens} tokens"
        )
    common = min(len(computed), len(prompt)) if prompt is not None else 0
    if prompt is not None and computed[:common] != prompt[:common]:
        raise AllocatorError(
            f"free: computed_tokens of allocation {allocation.allocation_id} do not start with "
            "the prefill_tokens it was allocated with"
        )


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def slots_for(blocks: Sequence[int], block_size: int, tokens: int) -> tuple[int, ...]:
    """# slots: [tokens], the consecutive slots of `blocks` truncated to the token budget."""
    if block_size == 1:
        return tuple(blocks[:tokens])
    slots = [s for b in blocks for s in range(b * block_size, (b + 1) * block_size)]
    return tuple(slots[:tokens])


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
    is reserved). Allocations take the LAST blocks of the list and freed (or evicted) blocks are
    appended, so the most recently freed blocks are reused first (TGI's order)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        check_allocator_shape(num_blocks, block_size)
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._free: list[int] = list(range(1, num_blocks))

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def total_blocks(self) -> int:
        return self._num_blocks - 1

    @property
    def free_blocks(self) -> int:
        return len(self._free)


class BlockAllocator(BlockPool):
    """No prefix caching (TGI's SimpleAllocator): the free list alone."""

    prefix_caching = False

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._live: dict[int, tuple[int, ...]] = {}  # allocation id -> its blocks
        self._used = 0
        self._next_id = 1

    @property
    def cached_blocks(self) -> int:
        return 0

    @property
    def used_blocks(self) -> int:
        return self._used

    @property
    def num_allocations(self) -> int:
        return len(self._live)

    def allocate(
        self, tokens: int, prefill_tokens: Sequence[int] | None, namespace: int = 0
    ) -> BlockAllocation | None:
        check_allocate_args(tokens, prefill_tokens)
        need = blocks_for(tokens, self._block_size)
        free = self._free
        if need > len(free):
            return None
        blocks: tuple[int, ...] = ()
        if need:  # free[-0:] would be the whole list
            blocks = tuple(free[-need:])
            del free[-need:]
        allocation_id = self._next_id
        self._next_id += 1
        self._live[allocation_id] = blocks
        self._used += need
        return BlockAllocation(
            allocation_id, blocks, slots_for(blocks, self._block_size, tokens), prefix_len=0
        )

    def free(self, allocation: BlockAllocation, computed_tokens: Sequence[int] | None) -> None:
        blocks = self._live.get(allocation.allocation_id)
        if blocks is None or blocks != allocation.blocks:
            raise AllocatorError(
                f"free: allocation {allocation.allocation_id} is not live (double free or foreign)"
            )
        check_computed_tokens(allocation, tuple(computed_tokens or ()), None)
        del self._live[allocation.allocation_id]
        self._used -= len(blocks)
        self._free.extend(blocks)

    def forget(self, namespace: int) -> None:
        """Nothing is cached without prefix caching."""

    def check_integrity(self) -> None:
        owners = [("free list", self._free)]
        owners += [(f"allocation {aid}", blocks) for aid, blocks in self._live.items()]
        check_block_ownership(self._num_blocks, owners)
        used = sum(len(blocks) for blocks in self._live.values())
        if used != self._used:
            raise AllocatorIntegrityError(f"used_blocks is {self._used}, allocations hold {used}")
        if self._used + len(self._free) != self.total_blocks:
            raise AllocatorIntegrityError(
                f"used {self._used} + free {len(self._free)} != total {self.total_blocks}"
            )
