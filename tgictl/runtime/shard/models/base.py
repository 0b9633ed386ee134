"""The contract every model family implements: one forward over a mixed batch of new tokens."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn

from tgictl.errors import InvalidRequestError
from tgictl.kernels import AttentionMetadata
from tgictl.kernels.lora import StepAdapters
from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE
from tgictl.kv_groups import GroupShape, hybrid_window
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.model_config import ModelConfig


class CausalLM(nn.Module, ABC):
    """A loaded decoder-only model on one rank. Subclasses implement `compute_hidden` and set `lm_head`."""

    lm_head: nn.Module  # [n, hidden] -> [n, vocab_size] logits, identical on every tensor-parallel rank

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype, device: torch.device, dist: DistContext) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.device = device
        self.dist = dist

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype | None = None,
                          kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE, local_blocks: int | None = None) -> KVCache:
        """A zeroed cache shaped for this model and rank (dtype defaults to the model's) in the `--kv-cache-dtype`
        format; with `local_blocks`, the sliding-window layers' in that many blocks (kv_cache.py)."""
        return KVCache.for_model(
            self.config,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=dtype or self.dtype,
            device=self.device,
            kv_cache_dtype=kv_cache_dtype,
            local_blocks=local_blocks,
        )

    def kv_bytes_per_block(self, block_size: int, dtype: torch.dtype | None = None,
                           kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE, num_layers: int | None = None) -> int:
        """One block's bytes on this rank in every layer (or in `num_layers` of them)."""
        return KVCache.bytes_per_block(
            self.config.num_layers if num_layers is None else num_layers,
            block_size,
            self.config.head_split(self.dist.rank, self.dist.world_size).kv_count,
            self.config.head_dim,
            dtype or self.dtype,
            kv_cache_dtype,
        )

    def local_group_shape(self, block_size: int, dtype: torch.dtype | None = None,
                          kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE) -> GroupShape | None:
        """The two layer groups' block bytes when the layers mix global and sliding-window ones; None otherwise."""
        windows = self.config.layer_windows
        window = hybrid_window(windows)
        if window is None:
            return None
        local = sum(1 for w in windows if w)
        return GroupShape(
            self.kv_bytes_per_block(block_size, dtype, kv_cache_dtype, len(windows) - local),
            self.kv_bytes_per_block(block_size, dtype, kv_cache_dtype, local),
            window,
        )

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        slots: Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        logit_indices: Tensor,
        adapters: StepAdapters | None = None,
    ) -> Tensor:
        """One step over every new token of the batch, concatenated in batch order.

        input_ids, positions, slots: [num_tokens] int64; logit_indices: [n] int64 rows whose logits
        are needed; adapters: the tokens' LoRA groupings (None: no token uses one). Writes the new K/V to `slots` in `kv_cache`. Returns logits [n, vocab_size]
        float32, identical on every tensor-parallel rank.
        """
        return self.logits(self.forward_hidden(input_ids, positions, slots, kv_cache, meta, logit_indices, adapters))

    def forward_hidden(
        self,
        input_ids: Tensor,
        positions: Tensor,
        slots: Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        logit_indices: Tensor,
        adapters: StepAdapters | None = None,
    ) -> Tensor:
        """`forward` up to the LM head: the final norm's output [n, hidden] at `logit_indices`, whose
        `logits()` are what `forward` returns. A caller that needs many rows' logits (a long prompt's
        logprobs) takes them a slice at a time from here instead of holding [n, vocab_size] at once."""
        tokens = meta.num_tokens
        if input_ids.shape != (tokens,) or positions.shape != (tokens,) or slots.shape != (tokens,):
            raise InvalidRequestError(
                f"input_ids {tuple(input_ids.shape)}, positions {tuple(positions.shape)} and slots "
                f"{tuple(slots.shape)} must all be [{tokens}] (the metadata's num_tokens)"
            )
        if kv_cache.num_layers != self.config.num_layers or kv_cache.block_size != meta.block_size:
            raise InvalidRequestError(
                f"KV cache has {kv_cache.num_layers} layers and block_size {kv_cache.block_size}; "
                f"the model has {self.config.num_layers} layers and the batch block_size {meta.block_size}"
            )
        with torch.inference_mode():
            return self.compute_hidden(input_ids, positions, slots, kv_cache, meta, logit_indices, adapters)

    def logits(self, hidden: Tensor) -> Tensor:
        """The LM head on rows of `forward_hidden`'s output (a collective when tensor parallel: every rank calls it
        for the same rows)."""
        with torch.inference_mode():
            return self.lm_head(hidden)

    @abstractmethod
    def compute_hidden(
        self,
        input_ids: Tensor,
        positions: Tensor,
        slots: Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        logit_indices: Tensor,
        adapters: StepAdapters | None = None,
    ) -> Tensor:
        """`forward_hidden` after its checks, inside inference mode."""
