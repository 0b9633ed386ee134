"""KV-cache block allocation for the router: the interface every allocator implements, the
allocation record the queue keeps per entry, and the plain allocator used without prefix caching.

The router owns shard memory (docs/architecture.md, "Decisions": The router owns memory): a request
gets its prompt's blocks here when the queue admits it, and more (`grow`) as it generates, one block when
it crosses into one (docs/architecture.md, "Memory model"). Block 0 is reserved for health probes and
never handed out. A slot is `block * block_size + offset`, so the shard derives slots from blocks.

An allocation's blocks are in sequence order and only ever grow at the end. When every layer of the model
attends through a sliding window, `release` gives back its leading blocks once every layer has left them
behind (docs/scheduling.md, "Sliding windows"): the ids stay in `blocks` so that block i still holds
positions i * block_size .., but the allocation no longer owns them and publishes nothing at `free`.

With two layer groups (global and local layers, tgictl/kv_groups.py) every id is a pair (global block, local
block) and the pool keeps a free list per group; `release` then gives back only the local halves (the global
layers still read those positions). Counts (`total_blocks`, `used_blocks`, ...) are of the global group: the
positions a sequence holds; `local_free_blocks` says what the local group has left.

Allocators are not thread-safe: the batcher owns one and calls it from a single task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from tgictl.errors import AllocatorError, AllocatorIntegrityError
from tgictl.kv_groups import KvGroups, blocks_for  # blocks_for: the queue and tests take it from here too
from tgictl.runtime.router.kv.block_pool import BlockPool


@dataclass(frozen=True)
class BlockAllocation:
    """Blocks handed to one queue entry. `grow` returns its successor (this one is then stale); pass the
    latest back to `free` exactly once."""

    allocation_id: int  # unique per allocator, starts at 1; the same across grow
    blocks: tuple[int, ...]  # [ceil(tokens / block_size)] block ids, cached prefix blocks first
    tokens: int  # the KV positions it was made (or grown) for
    # Leading prompt tokens whose KV is already in `blocks` (a multiple of block_size; 0 without
    # prefix caching). May equal the prompt length: the queue reduces it by one, not the allocator.
    prefix_len: int
    # blocks[:released] are not this allocation's any more (`release`): behind every layer's sliding window.
    # Cached prefix blocks among them stay the prefix cache's (pinned until `free`).
    released: int = 0


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
        self, tokens: int, prefill_tokens: Sequence[int] | None, namespace: int = 0, reserve: int = 0
    ) -> BlockAllocation | None:
        """Blocks for `tokens` KV entries; `prefill_tokens` (the prompt ids, or None to skip the
        cache) is the prefix-cache key within `namespace` (the LoRA adapter index: the same ids under
        two adapters have different KV). None when the blocks do not fit with `reserve` blocks still
        free or evictable afterwards (the admission watermark); then nothing stays pinned or taken."""
        ...

    def grow(self, allocation: BlockAllocation, tokens: int) -> BlockAllocation | None:
        """`allocation` extended with blocks at its end to cover `tokens` KV entries (itself when it
        already does); None when those blocks are not free or evictable (then nothing changed: the
        caller preempts someone or waits)."""
        ...

    def release(self, allocation: BlockAllocation, blocks: int) -> BlockAllocation:
        """`allocation` without its first `blocks` blocks (those it owns go back to the free list; itself when
        it released as many already): positions no layer will read again. Once it released any, `free`
        publishes nothing, since the prefix cache only holds whole sequences from their first token."""
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


def check_allocate_args(tokens: int, prefill_tokens: Sequence[int] | None) -> None:
    if tokens < 0:
        raise AllocatorError(f"allocate: tokens must be >= 0, got {tokens}")
    if prefill_tokens is not None and len(prefill_tokens) > tokens:
        # The prompt's own KV must fit in the allocation, or a cached prefix could exceed it.
        raise AllocatorError(
            f"allocate: {len(prefill_tokens)} prefill tokens exceed the budget of {tokens} tokens"
        )


def check_computed_tokens(
    allocation: BlockAllocation, computed: tuple[int, ...], prompt: tuple[int, ...] | None, block_size: int
) -> None:
    """`computed` must fit the allocation's blocks and, when a prompt key was given, agree with it where
    both exist: a prefix of the prompt, or the prompt followed by generated tokens (a continuation round
    or a preempted request publishes those). Anything else would publish blocks under tokens whose KV
    they do not hold."""
    capacity = len(allocation.blocks) * block_size
    if len(computed) > capacity:
        raise AllocatorError(
            f"free: {len(computed)} computed tokens exceed allocation {allocation.allocation_id}'s "
            f"{len(allocation.blocks)} blocks of {block_size}"
        )
    common = min(len(computed), len(prompt)) if prompt is not None else 0
    if prompt is not None and computed[:common] != prompt[:common]:
        raise AllocatorError(
            f"free: computed_tokens of allocation {allocation.allocation_id} do not start with "
            "the prefill_tokens it was allocated with"
        )


def check_release(allocation: BlockAllocation, blocks: int) -> None:
    if not 0 <= blocks < len(allocation.blocks):
        raise AllocatorError(
            f"release: allocation {allocation.allocation_id} can give back 0 .. {len(allocation.blocks) - 1} "
            f"leading blocks (it keeps its last), got {blocks}"
        )


class BlockAllocator(BlockPool):
    """No prefix caching (TGI's SimpleAllocator): the free list alone."""

    prefix_caching = False

    def __init__(self, num_blocks: int, block_size: int, groups: KvGroups | None = None) -> None:
        super().__init__(num_blocks, block_size, groups)
        self._live: dict[int, tuple[tuple[int, ...], int]] = {}  # allocation id -> (its blocks, released)
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
        self, tokens: int, prefill_tokens: Sequence[int] | None, namespace: int = 0, reserve: int = 0
    ) -> BlockAllocation | None:
        check_allocate_args(tokens, prefill_tokens)
        need = blocks_for(tokens, self._block_size)
        if need + max(reserve, 0) > self._available():
            return None
        blocks = self._take(need)
        allocation_id = self._next_id
        self._next_id += 1
        self._live[allocation_id] = (blocks, 0)
        self._used += need
        return BlockAllocation(allocation_id, blocks, tokens, prefix_len=0)

    def grow(self, allocation: BlockAllocation, tokens: int) -> BlockAllocation | None:
        self._check_live(allocation, "grow")
        need = blocks_for(tokens, self._block_size) - len(allocation.blocks)
        if need <= 0:
            return allocation if tokens <= allocation.tokens else replace(allocation, tokens=tokens)
        if need > self._available():
            return None
        blocks = allocation.blocks + self._take(need)
        self._live[allocation.allocation_id] = (blocks, allocation.released)
        self._used += need
        return replace(allocation, blocks=blocks, tokens=tokens)

    def release(self, allocation: BlockAllocation, blocks: int) -> BlockAllocation:
        self._check_live(allocation, "release")
        check_release(allocation, blocks)
        if blocks <= allocation.released:
            return allocation
        self._used -= self._release_owned(allocation.blocks[allocation.released : blocks])
        self._live[allocation.allocation_id] = (allocation.blocks, blocks)
        return replace(allocation, released=blocks)

    def _check_live(self, allocation: BlockAllocation, call: str) -> None:
        if self._live.get(allocation.allocation_id) != (allocation.blocks, allocation.released):
            raise AllocatorError(
                f"{call}: allocation {allocation.allocation_id} is not live (double free, stale or foreign)"
            )

    def free(self, allocation: BlockAllocation, computed_tokens: Sequence[int] | None) -> None:
        self._check_live(allocation, "free")
        check_computed_tokens(allocation, tuple(computed_tokens or ()), None, self._block_size)
        del self._live[allocation.allocation_id]
        self._used -= len(allocation.blocks) - (allocation.released if self._groups is None else 0)
        self._give_owned(allocation.blocks, 0, allocation.released)

    def forget(self, namespace: int) -> None:
        """Nothing is cached without prefix caching."""

    def check_integrity(self) -> None:
        whole = self._groups is None  # with one group released blocks are nobody's; with two, their global halves stay
        self._check_owners([
            (f"allocation {aid}", blocks[released:] if whole else blocks, released)
            for aid, (blocks, released) in self._live.items()
        ])
        used = sum(len(blocks) - (released if whole else 0) for blocks, released in self._live.values())
        if used != self._used:
            raise AllocatorIntegrityError(f"used_blocks is {self._used}, allocations hold {used}")
        if self._used + len(self._free) != self.total_blocks:
            raise AllocatorIntegrityError(
                f"used {self._used} + free {len(self._free)} != total {self.total_blocks}"
            )
