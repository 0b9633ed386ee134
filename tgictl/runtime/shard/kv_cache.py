"""The paged KV cache of one rank (docs/architecture.md, "Memory model"; docs/kv-cache.md).

Per layer, K and V are `[num_blocks, block_size, kv_heads_per_rank, head_dim]` in the cache's format
(`--kv-cache-dtype`: the model's dtype, int8 with a scale per token and head, or fp8; kernels/kv_pages.py);
token slot s = block * block_size + offset. The router decides which slots a forward writes; the cache only
holds the tensors.
"""

from __future__ import annotations

import torch

from tgictl.errors import ConfigError
from tgictl.kernels.kv_pages import Pages, allocate_pages, pages_nbytes
from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE, check_kv_cache_dtype, kv_bytes_per_head
from tgictl.runtime.shard.model_config import ModelConfig


class KVCache:
    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE,
    ) -> None:
        if num_layers < 1 or num_blocks < 1 or block_size < 1 or kv_heads < 1 or head_dim < 1:
            raise ConfigError(
                f"KV cache dimensions must be >= 1, got layers={num_layers}, blocks={num_blocks}, "
                f"block_size={block_size}, kv_heads={kv_heads}, head_dim={head_dim}"
            )
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype  # the model's: what attention reads the cache as
        self.kv_cache_dtype = check_kv_cache_dtype(kv_cache_dtype)
        self.device = device
        shape = (num_blocks, block_size, kv_heads, head_dim)
        # Zero-filled rather than empty: the memory is committed now (an over-sized cache fails at
        # allocation, not mid-request) and never-written slots hold finite values.
        self.keys: list[Pages] = [allocate_pages(kv_cache_dtype, shape, dtype, device) for _ in range(num_layers)]
        self.values: list[Pages] = [allocate_pages(kv_cache_dtype, shape, dtype, device) for _ in range(num_layers)]

    @classmethod
    def for_model(
        cls,
        config: ModelConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE,
    ) -> KVCache:
        return cls(
            num_layers=config.num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            kv_heads=config.head_split(rank, world_size).kv_count,
            head_dim=config.head_dim,
            dtype=dtype,
            device=device,
            kv_cache_dtype=kv_cache_dtype,
        )

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, kv_heads_per_rank: int, head_dim: int, dtype: torch.dtype,
        kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE,
    ) -> int:
        """Bytes one block takes on one rank, K and V of every layer (TGI's formula; an int8 cache adds its scales)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return num_layers * block_size * kv_heads_per_rank * 2 * kv_bytes_per_head(kv_cache_dtype, head_dim, itemsize)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return sum(pages_nbytes(pages) for pages in (*self.keys, *self.values))

    def layer(self, index: int) -> tuple[Pages, Pages]:
        """(key_cache, value_cache) of layer `index`, each [num_blocks, block_size, kv_heads, head_dim]."""
        return self.keys[index], self.values[index]
