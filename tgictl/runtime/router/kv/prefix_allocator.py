"""Prefix-caching block allocator (TGI's RadixAllocator, block granular).

`allocate` looks the prompt up in a RadixTrie, reuses the longest cached block-aligned prefix and
pins its node for the life of the allocation; the rest comes from the free list, evicting least
recently used unpinned prefixes when the list runs dry (`_reclaim`, the one place blocks leave the
cache); `grow` takes more blocks the same way. `free` publishes (`trie.insert`) the full blocks of the
tokens the caller says were computed (docs/architecture.md, "Decisions": Publish only computed KV: never blocks whose KV is unknown) and
returns everything else to the free list.

Block ownership at any time: free list | trie node (cached, maybe pinned) | allocation suffix
(the blocks after its cached prefix and after those it released behind a sliding window). Exactly one owner
per block; check_integrity proves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tgictl.errors import AllocatorError, AllocatorIntegrityError
from tgictl.kv_groups import KvGroups
from tgictl.runtime.router.kv.block_allocator import (
    BlockAllocation,
    BlockAllocator,
    KvAllocator,
    check_allocate_args,
    check_computed_tokens,
    check_release,
)
from tgictl.runtime.router.kv.block_pool import BlockPool
from tgictl.runtime.router.kv.cache_events import CacheEvents
from tgictl.runtime.router.kv.radix_trie import RadixTrie, TrieNode

__all__ = ["RadixAllocator", "RadixTrie", "TrieNode", "create_allocator"]


def create_allocator(
    num_blocks: int, block_size: int, prefix_caching: bool, events: CacheEvents | None = None,
    groups: KvGroups | None = None,
) -> KvAllocator:
    """The allocator for the prefix-caching setting. `num_blocks` counts reserved block 0 (TGI:
    max_batch_total_tokens // block_size). `events` hears what the prefix cache stores and evicts. `groups`: the
    shards' two layer groups, for a model mixing global and sliding-window layers (block ids are pairs)."""
    if prefix_caching:
        return RadixAllocator(num_blocks, block_size, events, groups)
    return BlockAllocator(num_blocks, block_size, groups)


class _Live:
    """What free() needs to know about a live allocation."""

    __slots__ = ("node", "prefix_blocks", "prompt", "blocks", "namespace", "released")

    def __init__(
        self, node: TrieNode, prefix_blocks: int, prompt: tuple[int, ...] | None,
        blocks: tuple[int, ...], namespace: int,
    ) -> None:
        self.node = node  # pinned trie node (the root when nothing was cached)
        self.prefix_blocks = prefix_blocks  # blocks[:prefix_blocks] belong to the trie
        self.prompt = prompt  # the prefill key, None when the caller skipped the cache
        self.blocks = blocks
        self.namespace = namespace  # the trie root it was looked up and is published under
        self.released = 0  # blocks[:released] given back (release): it owns blocks[max(prefix, released):]

    @property
    def owned_from(self) -> int:
        return max(self.prefix_blocks, self.released)


class RadixAllocator(BlockPool):
    """KvAllocator with prefix caching. See the module docstring."""

    prefix_caching = True

    def __init__(
        self, num_blocks: int, block_size: int, events: CacheEvents | None = None, groups: KvGroups | None = None
    ) -> None:
        super().__init__(num_blocks, block_size, groups)
        self._events = events
        self._trie = RadixTrie(block_size)
        self._live: dict[int, _Live] = {}
        self._suffix_blocks = 0  # blocks owned by allocations outright (not via the trie)
        self._next_id = 1

    @property
    def trie(self) -> RadixTrie:
        """The cache itself, for inspection (tests, debugging); mutate it only via the allocator."""
        return self._trie

    @property
    def cached_blocks(self) -> int:
        return self._trie.evictable_blocks

    @property
    def used_blocks(self) -> int:
        return self._suffix_blocks + self._trie.pinned_blocks

    @property
    def num_allocations(self) -> int:
        return len(self._live)

    def allocate(
        self, tokens: int, prefill_tokens: Sequence[int] | None, namespace: int = 0, reserve: int = 0
    ) -> BlockAllocation | None:
        check_allocate_args(tokens, prefill_tokens)
        trie, bs = self._trie, self._block_size
        prompt = None if prefill_tokens is None else tuple(prefill_tokens)
        if prompt:
            node, blocks = trie.find(prompt, namespace)
        else:
            node, blocks = trie.root_for(namespace), []
        # Pin before measuring what is evictable, so the prefix we are about to use is not.
        trie.pin(node)
        prefix_blocks = len(blocks)
        need = -(-(tokens - prefix_blocks * bs) // bs)  # blocks_for, inlined: this is per request
        if need + max(reserve, 0) > self._available() + trie.evictable_blocks or not self._reclaim(need):
            trie.unpin(node)
            return None
        blocks.extend(self._take(need))
        allocation_id = self._next_id
        self._next_id += 1
        block_tuple = tuple(blocks)
        self._live[allocation_id] = _Live(node, prefix_blocks, prompt, block_tuple, namespace)
        self._suffix_blocks += need
        return BlockAllocation(allocation_id, block_tuple, tokens, prefix_blocks * bs)

    def grow(self, allocation: BlockAllocation, tokens: int) -> BlockAllocation | None:
        live = self._live_of(allocation, "grow")
        need = -(-tokens // self._block_size) - len(allocation.blocks)
        if need <= 0:
            return allocation if tokens <= allocation.tokens else replace(allocation, tokens=tokens)
        if not self._reclaim(need):
            return None
        live.blocks = allocation.blocks + self._take(need)
        self._suffix_blocks += need
        return replace(allocation, blocks=live.blocks, tokens=tokens)

    def release(self, allocation: BlockAllocation, blocks: int) -> BlockAllocation:
        live = self._live_of(allocation, "release")
        check_release(allocation, blocks)
        if blocks <= live.released:
            return allocation
        start = live.owned_from
        live.released = blocks
        # Cached prefix blocks stay the trie's, pinned.
        self._suffix_blocks -= self._release_owned(allocation.blocks[start : live.owned_from])
        return replace(allocation, released=blocks)

    def _global_owned_from(self, live: _Live) -> int:
        """The first block whose global half the allocation owns: released blocks keep theirs with two groups."""
        return live.owned_from if self._groups is None else live.prefix_blocks

    def _reclaim(self, need: int) -> bool:
        """Make `need` blocks free, evicting least recently used cached prefixes if the free list is short;
        False (nothing evicted) when even the whole evictable cache would not do. Unlike TGI, evict only
        when that makes the allocation fit: a failing request should not flush the cache."""
        short = need - self._available()
        if short <= 0:
            return True
        if short > self._trie.evictable_blocks:
            return False
        evicted = self._trie.evict(short)  # whole pairs with two groups: each adds one block to both free lists
        if self._events is not None:
            self._events.removed(evicted)
        self._give(evicted)
        return True

    def _live_of(self, allocation: BlockAllocation, call: str) -> _Live:
        live = self._live.get(allocation.allocation_id)
        if live is None or live.blocks != allocation.blocks or live.released != allocation.released:
            raise AllocatorError(
                f"{call}: allocation {allocation.allocation_id} is not live (double free, stale or foreign)"
            )
        return live

    def free(self, allocation: BlockAllocation, computed_tokens: Sequence[int] | None) -> None:
        live = self._live_of(allocation, "free")
        computed = tuple(computed_tokens) if computed_tokens else ()
        check_computed_tokens(allocation, computed, live.prompt, self._block_size)
        del self._live[allocation.allocation_id]
        trie, bs, blocks = self._trie, self._block_size, live.blocks
        trie.unpin(live.node)
        prefix = live.prefix_blocks
        self._suffix_blocks -= len(blocks) - self._global_owned_from(live)
        full = len(computed) // bs  # only whole blocks can be looked up later
        if full <= prefix or live.owned_from > prefix:  # released blocks broke the chain from the first token
            self._give_owned(blocks, prefix, live.released)
            return
        # Nothing ran between unpin and insert, so the trie still holds our prefix and
        # `present` covers it; blocks in [prefix, present) were published meanwhile by an
        # overlapping request and ours are duplicates.
        present = trie.insert(computed[: full * bs], blocks[:full], live.namespace) // bs
        if present < prefix:
            raise AllocatorIntegrityError(
                f"allocation {allocation.allocation_id}'s cached prefix vanished from the trie"
            )
        self._give(blocks[prefix:present])
        self._give(blocks[full:])  # partial last block and generated tokens are never cached
        if self._events is not None and full > present:
            self._events.stored(live.namespace, computed[: full * bs], blocks[:full], present)

    def forget(self, namespace: int) -> None:
        """Drop the cached prefixes of `namespace` (an unloaded adapter's): their blocks become free."""
        self._give(self._trie.drop_namespace(namespace))

    def check_integrity(self) -> None:
        trie = self._trie
        trie.check_integrity()
        owners: list[tuple[str, Sequence[int], int]] = [(f"trie node {n.node_id}", n.blocks, 0) for n in trie.nodes()]
        pins: dict[int, int] = {}
        suffix = 0
        for aid, live in self._live.items():
            start = self._global_owned_from(live)
            owners.append((f"allocation {aid}", live.blocks[start:], live.owned_from - start))
            suffix += len(live.blocks) - start
            path = trie.path_blocks(live.node)
            if list(live.blocks[: live.prefix_blocks]) != path[: live.prefix_blocks]:
                raise AllocatorIntegrityError(
                    f"allocation {aid}'s prefix blocks differ from its pinned trie path"
                )
            if 0 in live.blocks:
                raise AllocatorIntegrityError(f"allocation {aid} holds reserved block 0")
            pins[id(live.node)] = pins.get(id(live.node), 0) + 1
        self._check_owners(owners)
        for node in trie.nodes():
            direct = node.ref_count - len(node.children)
            if direct != pins.pop(id(node), 0):
                raise AllocatorIntegrityError(f"{node!r}: {direct} pins, allocations disagree")
        for live in self._live.values():
            if live.node.node_id <= 0:  # pinned to a root: nothing was cached
                pins.pop(id(live.node), None)
        if pins:
            raise AllocatorIntegrityError(f"{len(pins)} allocations pin nodes outside the trie")
        if suffix != self._suffix_blocks:
            raise AllocatorIntegrityError(
                f"allocations own {suffix} blocks outright, tracked {self._suffix_blocks}"
            )
        counts = (self.used_blocks, self.cached_blocks, self.free_blocks)
        if sum(counts) != self.total_blocks:
            raise AllocatorIntegrityError(
                f"used {counts[0]} + cached {counts[1]} + free {counts[2]} != {self.total_blocks}"
            )
