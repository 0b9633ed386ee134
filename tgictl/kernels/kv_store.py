"""Write new tokens' K/V into the paged cache by slot (docs/architecture.md, "Memory model")."""

from __future__ import annotations

from torch import Tensor


def store_kv(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slots: Tensor) -> None:
    """Write row t of key/value at flat slot slots[t] = block * block_size + offset, in place.

    key, value: [num_tokens, kv_heads, head_dim]
    key_cache, value_cache: [num_blocks, block_size, kv_heads, head_dim] (contiguous)
    slots: [num_tokens] int64, each in 0 .. num_blocks * block_size - 1
    """
    # A view over the (contiguous) cache, so index_copy_ writes straight into its storage.
    # key_flat: [num_blocks * block_size, kv_heads, head_dim]
    key_flat = key_cache.view(-1, key_cache.shape[2], key_cache.shape[3])
    value_flat = value_cache.view(-1, value_cache.shape[2], value_cache.shape[3])
    # The cache may hold a narrower dtype than the activations; the cast happens here, once.
    key_flat.index_copy_(0, slots, key.to(key_cache.dtype))
    value_flat.index_copy_(0, slots, value.to(value_cache.dtype))
