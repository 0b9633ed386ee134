import torch

from tgictl.kernels import store_kv


def test_store_kv_writes_exactly_the_given_slots() -> None:
    gen = torch.Generator().manual_seed(0)
    num_blocks, block_size, kv_heads, head_dim = 5, 4, 2, 3
    key_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim)
    value_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim)
    slots = torch.tensor([17, 2, 8, 19, 4], dtype=torch.int64)  # unordered, across blocks
    key = torch.randn(5, kv_heads, head_dim, generator=gen) + 10.0  # never 0
    value = torch.randn(5, kv_heads, head_dim, generator=gen) - 10.0

    store_kv(key, value, key_cache, value_cache, slots)

    for t, slot in enumerate(slots.tolist()):
        block, offset = divmod(slot, block_size)
        assert torch.equal(key_cache[block, offset], key[t])
        assert torch.equal(value_cache[block, offset], value[t])
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slots] = True
    untouched = ~written.view(num_blocks, block_size)
    assert torch.count_nonzero(key_cache[untouched]) == 0
    assert torch.count_nonzero(value_cache[untouched]) == 0


def test_store_kv_overwrites_and_casts_to_cache_dtype() -> None:
    key_cache = torch.full((2, 2, 1, 2), 7.0, dtype=torch.bfloat16)
    value_cache = torch.full((2, 2, 1, 2), 7.0, dtype=torch.bfloat16)
    key = torch.tensor([[[1.5, -2.25]]], dtype=torch.float32)
    value = torch.tensor([[[0.5, 3.0]]], dtype=torch.float32)

    store_kv(key, value, key_cache, value_cache, torch.tensor([3]))

    assert key_cache.dtype == torch.bfloat16
    assert key_cache[1, 1, 0].tolist() == [1.5, -2.25]
    assert value_cache[1, 1, 0].tolist() == [0.5, 3.0]
    assert key_cache.view(-1, 1, 2)[:3].eq(7.0).all()
    assert value_cache.view(-1, 1, 2)[:3].eq(7.0).all()


def test_store_kv_with_no_tokens_changes_nothing() -> None:
    key_cache = torch.ones(2, 4, 1, 2)
    value_cache = torch.ones(2, 4, 1, 2)
    empty = torch.empty(0, 1, 2)
    store_kv(empty, empty, key_cache, value_cache, torch.empty(0, dtype=torch.int64))
    assert key_cache.eq(1).all() and value_cache.eq(1).all()
