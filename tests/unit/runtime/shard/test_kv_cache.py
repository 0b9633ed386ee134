"""KVCache: per-layer paged tensors in the layout of docs/architecture.md, "Memory model", and the per-block byte count."""

from __future__ import annotations

import pytest
import torch

from tgictl.errors import ConfigError, InvalidRequestError
from tgictl.kernels import build_attention_metadata
from tgictl.kv_groups import KvGroups
from tgictl.runtime.shard.batch import check_block_ids
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


def test_two_layer_groups_keep_local_layers_in_their_own_blocks_and_split_pair_ids() -> None:
    """Local and global layers (tgictl/kv_groups.py): the local layers' pages hold `local_blocks` blocks, and a step's
    pair ids become each layer's own slots and block tables."""
    cache = KVCache(num_layers=3, num_blocks=5, block_size=4, kv_heads=2, head_dim=8, dtype=torch.float32,
                    device=CPU, layer_windows=(None, 8, 8), local_blocks=3)
    assert cache.groups is not None and (cache.groups.global_blocks, cache.groups.local_blocks) == (5, 3)
    assert [cache.layer(i)[0].shape[0] for i in range(3)] == [5, 3, 3]
    table = [KvGroups.pair(4, 2), KvGroups.pair(1, 1)]  # positions 0..3 in (4, 2), 4..7 in (1, 1)
    slots = torch.tensor([table[p // 4] * 4 + p % 4 for p in range(5, 7)])
    meta = build_attention_metadata([5], [2], [table], 4, CPU)
    inputs = cache.layer_inputs(slots, meta)
    (global_slots, global_meta), (local_slots, local_meta) = inputs[0], inputs[1]
    assert inputs[2] is inputs[1]
    assert global_slots.tolist() == [5, 6] and local_slots.tolist() == [5, 6]  # block 1 in both groups
    assert global_meta.block_table_lists == ((4, 1),) and local_meta.block_table_lists == ((2, 1),)
    one_group = KVCache(num_layers=3, num_blocks=5, block_size=4, kv_heads=2, head_dim=8, dtype=torch.float32,
                        device=CPU, layer_windows=(None, 8, 8))
    assert one_group.groups is None and one_group.layer_inputs(slots, meta) == [(slots, meta)] * 3


def test_a_local_group_needs_layers_that_mix_windows() -> None:
    with pytest.raises(ConfigError, match="mix global and sliding-window"):
        KVCache(num_layers=2, num_blocks=5, block_size=4, kv_heads=2, head_dim=8, dtype=torch.float32,
                device=CPU, layer_windows=(8, 8), local_blocks=3)


def test_pair_ids_outside_either_group_are_refused() -> None:
    groups = KvGroups(global_blocks=5, local_blocks=3, window=8)
    check_block_ids("request 1", [KvGroups.pair(4, 2)], 5, groups)
    for bad in (KvGroups.pair(5, 1), KvGroups.pair(1, 3)):
        with pytest.raises(InvalidRequestError, match="request 1: block ids must pair a global block in 0 .. 4"):
            check_block_ids("request 1", [bad], 5, groups)
