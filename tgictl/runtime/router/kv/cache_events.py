"""The radix cache's changes as vLLM's KV cache events (docs/replicas.md, "KV events").

Blocks become shareable at exactly one place, the radix allocator's `free` publishing a computed prefix
(`stored`), and stop being so at one other, eviction (`removed`); a router that starts, or clears its
cache, has none (`cleared`). `KvEventLog` turns those three calls into vLLM's events, so that llm-d's
precise prefix-cache scorer (which subscribes to vLLM's ZMQ stream) can index tgictl replicas:

    BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium)
    BlockRemoved(block_hashes, medium)
    AllBlocksCleared()

as msgspec encodes vLLM's tagged, array-like structs: a list whose first element is the class name.
A block's hash chains its parent's hash, its adapter and its tokens (64-bit BLAKE2b), so a prefix has the
same hashes on every replica and a consumer can link a BlockStored to the one before it; the log keeps
each cached block's hash until the block is evicted, which is how BlockRemoved names it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Protocol

Event = list[Any]  # one vLLM event, encoded as msgspec's array_like tagged struct


class CacheEvents(Protocol):
    """What the radix allocator reports (kv/prefix_allocator.py)."""

    def stored(self, namespace: int, tokens: Sequence[int], blocks: Sequence[int], first: int) -> None:
        """`tokens` (whole blocks from the root of `namespace`) are cached in `blocks`; blocks[first:] are new."""

    def removed(self, blocks: Sequence[int]) -> None:
        """`blocks` left the cache."""

    def cleared(self) -> None:
        """Nothing is cached."""


def block_hash(parent: int | None, namespace: int, tokens: Sequence[int]) -> int:
    digest = hashlib.blake2b(digest_size=8)
    digest.update((parent if parent is not None else 0).to_bytes(8, "little"))
    digest.update(namespace.to_bytes(4, "little"))
    digest.update(array("q", tokens).tobytes())
    return int.from_bytes(digest.digest(), "little")


class KvEventLog:
    """CacheEvents as vLLM events, handed to `sink` one list per cache change (the publisher batches
    them with a timestamp and a sequence number)."""

    def __init__(self, block_size: int, sink: Callable[[list[Event]], None], medium: str | None = None) -> None:
        self._bs = block_size
        self._sink = sink
        self._medium = medium
        self._hashes: dict[int, int] = {}  # cached block id -> its hash

    @property
    def cached(self) -> int:
        return len(self._hashes)

    def stored(self, namespace: int, tokens: Sequence[int], blocks: Sequence[int], first: int) -> None:
        bs, hashes, parent = self._bs, [], None
        for index in range(len(blocks)):
            parent = block_hash(parent, namespace, tokens[index * bs : (index + 1) * bs])
            hashes.append(parent)
        for block, value in zip(blocks[first:], hashes[first:]):
            self._hashes[block] = value
        before = hashes[first - 1] if first > 0 else None
        lora_id = namespace if namespace > 0 else None  # vLLM's: None for the base model
        self._sink([["BlockStored", hashes[first:], before, list(tokens[first * bs :]), bs, lora_id, self._medium]])

    def removed(self, blocks: Sequence[int]) -> None:
        gone = [self._hashes.pop(block) for block in blocks if block in self._hashes]
        if gone:
            self._sink([["BlockRemoved", gone, self._medium]])

    def cleared(self) -> None:
        self._hashes.clear()
        self._sink([["AllBlocksCleared"]])
