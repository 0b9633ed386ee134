"""The paged KV cache of one rank (docs/architecture.md, "Memory model"; docs/kv-cache.md).

Per layer, K and V are `[num_blocks, block_size, kv_heads_per_rank, head_dim]` in the cache's format
(`--kv-cache-dtype`: the model's dtype, int8 with a scale per token and head, or fp8; kernels/kv_pages.py);
token slot s = block * block_size + offset. The router decides which slots a forward writes; the cache only
holds the tensors.

A model mixing global and sliding-window layers keeps two layer groups (tgictl/kv_groups.py): the global layers'
pages have `num_blocks` blocks, the local layers' `local_blocks`, and the ids the router sends are pairs; `layer_inputs`
turns a step's slots and metadata into each layer's (the global or the local half of every id).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tgictl.errors import ConfigError
from tgictl.kernels import AttentionMetadata
from tgictl.kernels.kv_pages import Pages, allocate_pages, pages_nbytes
from tgictl.kv_groups import PAIR_SHIFT, KvGroups, hybrid_window
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
        layer_windows: Sequence[int | None] = (),
        local_blocks: int | None = None,
    ) -> None:
        """`local_blocks`: the local group's blocks when the layers mix global ones and sliding-window ones
        (`layer_windows`, None: no window); None keeps every layer in `num_blocks` blocks."""
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
        window = hybrid_window(layer_windows) if local_blocks is not None else None
        if local_blocks is not None and (window is None or len(layer_windows) != num_layers):
            raise ConfigError("a local layer group needs layers that mix global and sliding-window ones")
        self.groups = KvGroups(num_blocks, local_blocks, window) if local_blocks is not None and window else None
        # Per layer: True when it keeps its K/V in the local group's blocks.
        self.is_local = [self.groups is not None and bool(w) for w in layer_windows] or [False] * num_layers
        # Zero-filled rather than empty: the memory is committed now (an over-sized cache fails at
        # allocation, not mid-request) and never-written slots hold finite values.
        self.keys: list[Pages] = []
        self.values: list[Pages] = []
        for local in self.is_local:
            blocks = local_blocks if local and local_blocks is not None else num_blocks
            shape = (blocks, block_size, kv_heads, head_dim)
            self.keys.append(allocate_pages(kv_cache_dtype, shape, dtype, device))
            self.values.append(allocate_pages(kv_cache_dtype, shape, dtype, device))

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
        local_blocks: int | None = None,
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
            layer_windows=config.layer_windows,
            local_blocks=local_blocks,
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

    def layer_inputs(self, slots: Tensor, meta: AttentionMetadata) -> list[tuple[Tensor, AttentionMetadata]]:
        """Each layer's (slots, metadata) for a step whose block ids are the router's: as given with one group;
        with two, the global half of every pair id for a global layer and the local half for a local one."""
        if self.groups is None:
            return [(slots, meta)] * self.num_layers
        bs, low = self.block_size, (1 << PAIR_SHIFT) - 1
        blocks, offsets = slots // bs, slots % bs
        split = self.groups.split
        halves = []
        for half, ids in enumerate((blocks & low, blocks >> PAIR_SHIFT)):
            tables = [[split(block)[half] for block in table] for table in meta.block_table_lists]
            halves.append((ids * bs + offsets, AttentionMetadata.build(
                meta.cache_lens, meta.new_lens, tables, bs, meta.device)))
        return [halves[1] if local else halves[0] for local in self.is_local]
