"""Write new tokens' K/V into the paged cache by slot (docs/architecture.md, "Memory model")."""

from __future__ import annotations

from torch import Tensor

from tgictl.kernels.kv_pages import Pages, store_rows


def store_kv(key: Tensor, value: Tensor, key_cache: Pages, value_cache: Pages, slots: Tensor) -> None:
    """Write row t of key/value at flat slot slots[t] = block * block_size + offset, in place, in the cache's
    format (kernels/kv_pages.py: the model's dtype, int8 with scales, or fp8).

    key, value: [num_tokens, kv_heads, head_dim]
    key_cache, value_cache: [num_blocks, block_size, kv_heads, head_dim] (contiguous)
    slots: [num_tokens] int64, each in 0 .. num_blocks * block_size - 1
    """
    store_rows(key, key_cache, slots)
    store_rows(value, value_cache, slots)
