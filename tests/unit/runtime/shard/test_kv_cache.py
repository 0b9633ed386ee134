"""KVCache: per-layer paged tensors in the layout of docs/architecture.md, "Memory model", and the per-block byte count."""

from __future__ import annotations

import pytest
import torch

from tgictl.errors import ConfigError
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.model_config import ModelConfig

CPU = torch.device("cpu")


def test_layout_per_layer() -> None:
    cache = KVCache(num_layers=3, num_blocks=5, block_size=4, kv_heads=2, head_dim=8, dtype=torch.bfloat16, device=CPU)
    assert len(cache.keys) == len(cache.values) == 3
    key, value = cache.layer(2)
    assert key.shape == value.shape == (5, 4, 2, 8)
    assert key.dtype == torch.bfloat16 and key.is_contiguous()
    assert key.data_ptr() != value.data_ptr() and cache.keys[0].data_ptr() != cache.keys[1].data_ptr()
    assert cache.num_slots == 20
    assert cache.nbytes == sum(t.numel() * t.element_size() for t in cache.keys + cache.values)


def test_bytes_per_block_is_tgis_formula() -> None:
    # layers * block_size * kv_heads * head_dim * 2 (K and V) * dtype bytes
    assert KVCache.bytes_per_block(30, 16, 3, 64, torch.bfloat16) == 30 * 16 * 3 * 64 * 2 * 2
    assert KVCache.bytes_per_block(2, 16, 1, 16, torch.float32) == 2 * 16 * 16 * 2 * 4


def test_for_model_uses_the_ranks_kv_heads() -> None:
    config = ModelConfig.from_dict(
        {
            "model_type": "llama",
            "vocab_size": 10,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 64,
        }
    )
    cache = KVCache.for_model(config, world_size=2, num_blocks=3, block_size=16, dtype=torch.float32, device=CPU)
    assert cache.layer(0)[0].shape == (3, 16, 1, 8)


def test_empty_cache_is_refused() -> None:
    with pytest.raises(ConfigError, match="blocks=0"):
        KVCache(num_layers=1, num_blocks=0, block_size=16, kv_heads=1, head_dim=8, dtype=torch.float32, device=CPU)
