"""The one place that maps the prefix-caching setting to an allocator class."""

from __future__ import annotations

from tgictl.runtime.router.block_allocator import BlockAllocator, KvAllocator
from tgictl.runtime.router.radix import RadixAllocator


def create_allocator(num_blocks: int, block_size: int, prefix_caching: bool) -> KvAllocator:
    """`num_blocks` counts reserved block 0 (TGI: max_batch_total_tokens // block_size)."""
    if prefix_caching:
        return RadixAllocator(num_blocks, block_size)
    return BlockAllocator(num_blocks, block_size)
