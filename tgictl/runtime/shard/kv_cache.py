"""The paged KV cache of one rank (docs/architecture.md, "Memory model").

Per layer, K and V are `[num_blocks, block_size, kv_heads_per_rank, head_dim]`; token slot
s = block * block_size + offset. The router decides which slots a forward writes; the cache only holds
the tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tgictl.errors import ConfigError
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
        self.dtype = dtype
        self.device = device
        shape = (num_blocks, block_size, kv_heads, head_dim)
        # Zero-filled rather than empty: the memory is committed now (an over-sized cache fails at
        # allocation, not mid-request) and never-written slots hold finite values.
        self.keys: list[Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values: list[Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

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
    ) -> KVCache:
        return cls(
            num_layers=config.num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            kv_heads=config.head_split(rank, world_size).kv_count,
            head_dim=config.head_dim,
            dtype=dtype,
            device=device,
        )

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, kv_heads_per_rank: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes one block takes on one rank, K and V of every layer (TGI's formula)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return num_layers * block_size * kv_heads_per_rank * head_dim * 2 * itemsize

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        per_block = self.bytes_per_block(self.num_layers, self.block_size, self.kv_heads, self.head_dim, self.dtype)
        return self.num_blocks * per_block

    def layer(self, index: int) -> tuple[Tensor, Tensor]:
        """(key_cache, value_cache) of layer `index`, each [num_blocks, block_size, kv_heads, head_dim]."""
        return self.keys[index], self.values[index]
