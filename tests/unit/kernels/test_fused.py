"""The compiled elementwise kernels (kernels/fused.py) against the torch ops they replace: RMSNorm with
and without the residual add, SiLU*mul, rotary + KV store, and the greedy choice with its logprob.

bf16 results must be the torch ops' own bf16 values (at most one bf16 step apart, rarely, where only
the order of a float32 sum differs); float32 within float rounding."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from tgictl.errors import InvalidRequestError
from tgictl.kernels import fused, store_kv
from tgictl.kernels.native import load_native_kernels
from tgictl.runtime.shard.layers.mlp import gated_activation
from tgictl.runtime.shard.layers.norm import RMSNorm
from tgictl.runtime.shard.layers.rotary import apply_rotary

DTYPES = [torch.float32, torch.bfloat16]
# (rows, dim): decode-sized (serial in C) and prefill-sized (OpenMP over rows); dims that are multiples of 32 take
# the AVX-512 rows where the build has them, 40 the generic loop
NORM_SHAPES = [(3, 64), (32, 576), (300, 576), (5, 40)]


@pytest.fixture(autouse=True)
def _native_available() -> None:
    assert load_native_kernels() is not None  # the development and CI machines have gcc


def _close(native: Tensor, torch_ops: Tensor) -> None:
    assert native.dtype == torch_ops.dtype and native.shape == torch_ops.shape
    if native.dtype == torch.bfloat16:
        # the sums of squares differ in order only: a value may land one bf16 step away, rarely
        diff = (native.float() - torch_ops.float()).abs()
        step = torch_ops.float().abs().clamp_min(1e-30) * 2.0**-7
        assert bool((diff <= step).all())
        assert (native != torch_ops).float().mean().item() < 1e-3
    else:
        torch.testing.assert_close(native, torch_ops, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_rms_norm_matches_the_torch_ops(shape: tuple[int, int]) -> None:
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(shape[0])
    norm = RMSNorm((torch.rand(shape[1], generator=gen) + 0.5).to(dtype), eps=1e-5)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    native = fused.rms_norm(x, norm.weight, norm.eps)
    assert native is not None
    assert native[0] is x
    _close(native[1], norm.torch_forward(x))
    _close(norm(x), norm.torch_forward(x))


@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_residual_add_and_norm_match_the_torch_ops(shape: tuple[int, int]) -> None:
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(7 + shape[0])
    norm = RMSNorm((torch.rand(shape[1], generator=gen) + 0.5).to(dtype), eps=1e-6)
    x, delta = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    total, normed = norm.add_forward(x, delta)
    assert torch.equal(total, x + delta)  # the add rounds exactly as torch's
    _close(normed, norm.torch_forward(x + delta))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, inter", [(1, 1536), (32, 1536), (200, 1536), (200, 40)])
def test_silu_mul_matches_the_torch_ops(dtype: torch.dtype, rows: int, inter: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    gate_up = (torch.randn(rows, 2 * inter, generator=gen) * 4).to(dtype)
    gate_up[0, :6] = torch.tensor([0.0, -0.0, 100.0, -100.0, 1e-8, -1e-8])  # the exponential's edges
    native = fused.silu_mul(gate_up)
    assert native is not None
    _close(native, gated_activation(gate_up, "silu"))


def _rotary_case(dtype: torch.dtype, tokens: int, heads: int, kv_heads: int, d: int, blocks: int = 8,
                 block: int = 4) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(tokens * 31 + heads)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    angles = torch.rand(tokens, d // 2, generator=gen) * 6
    slots = torch.randperm(blocks * block, generator=gen)[:tokens]
    return qkv, angles.cos().to(dtype), angles.sin().to(dtype), slots


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", [(5, 9, 3, 64), (20, 4, 1, 16), (3, 6, 6, 8)], ids=["gqa", "mqa", "mha"])
def test_rotary_store_matches_apply_rotary_and_store_kv(dtype: torch.dtype, layout: tuple[int, ...]) -> None:
    tokens, heads, kv_heads, d = layout
    qkv, cos, sin, slots = _rotary_case(dtype, tokens, heads, kv_heads, d)
    caches = [torch.full((8, 4, kv_heads, d), float("nan"), dtype=dtype) for _ in range(4)]
    q = fused.rotary_store_kv(qkv, cos, sin, slots, caches[0], caches[1], heads, kv_heads)
    assert q is not None
    qk = apply_rotary(qkv[:, : (heads + kv_heads) * d].view(tokens, heads + kv_heads, d), cos, sin)
    v = qkv[:, (heads + kv_heads) * d :].view(tokens, kv_heads, d)
    store_kv(qk[:, heads:], v, caches[2], caches[3], slots)
    exact = dtype == torch.bfloat16  # every product and sum rounded as torch's bf16 ops round them
    for native, torch_ops in ((q, qk[:, :heads]), (caches[0], caches[2]), (caches[1], caches[3])):
        if exact:
            assert torch.equal(native.nan_to_num(7.0), torch_ops.nan_to_num(7.0))
        else:
            torch.testing.assert_close(native, torch_ops, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_rotary_store_refuses_a_slot_outside_the_cache_and_writes_nothing() -> None:
    qkv, cos, sin, slots = _rotary_case(torch.float32, 3, 4, 2, 8)
    key_cache, value_cache = torch.zeros(8, 4, 2, 8), torch.zeros(8, 4, 2, 8)
    slots[-1] = 8 * 4
    with pytest.raises(InvalidRequestError, match="outside the cache's 32 slots"):
        fused.rotary_store_kv(qkv, cos, sin, slots, key_cache, value_cache, 4, 2)
    assert not key_cache.any() and not value_cache.any()


def test_inputs_the_kernels_do_not_take_fall_back_to_torch() -> None:
    x = torch.randn(4, 64, dtype=torch.float16)
    assert fused.rms_norm(x, torch.ones(64, dtype=torch.float16), 1e-5) is None
    # float32 norms stay torch's: they must equal transformers' bit for bit (test_layers.py)
    assert fused.rms_norm(torch.randn(4, 64), torch.ones(64), 1e-5) is None
    bf16 = torch.randn(64, 4, dtype=torch.bfloat16)
    assert fused.rms_norm(bf16.t(), torch.ones(64, dtype=torch.bfloat16), 1e-5) is None  # not contiguous
    assert fused.silu_mul(torch.randn(3, 7)) is None  # odd width: not a gate|up pair
    assert fused.greedy(torch.randn(3, 10, dtype=torch.float16)) is None
    assert fused.greedy(torch.randn(10, 3).t()) is None  # not contiguous
    qkv, cos, sin, slots = _rotary_case(torch.float32, 3, 4, 2, 8)
    narrow = torch.zeros(8, 4, 2, 8, dtype=torch.bfloat16)  # a cache of another dtype: store_kv casts
    assert fused.rotary_store_kv(qkv, cos, sin, slots, narrow, narrow.clone(), 4, 2) is None


@pytest.mark.parametrize("rows", [1, 32, 64])
def test_greedy_equals_argmax_and_log_softmax(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, 49152, generator=gen) * 5
    logits[0, 100] = logits[0, 7] = logits[0].max() + 1  # a tie: the lowest id wins, as torch.argmax
    greedy = fused.greedy(logits)
    assert greedy is not None
    ids, logprobs = greedy
    assert torch.equal(ids, logits.argmax(-1))
    assert ids[0].item() == 7
    expected = logits.log_softmax(-1).gather(1, ids[:, None])[:, 0]
    # log_softmax's float32 sum over 49,152 terms drifts by ~1e-6 with AVX-512's 16 lanes and by up to ~1e-5
    # with AVX2's 8 (the kernel sums in double, held to the float64 truth below)
    torch.testing.assert_close(logprobs, expected, rtol=0, atol=2e-5)
    exact = logits.double().log_softmax(-1).gather(1, ids[:, None])[:, 0]
    torch.testing.assert_close(logprobs.double(), exact, rtol=0, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 32])
def test_greedy_on_bf16_logits_equals_it_on_their_float32_values(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows + 1)
    logits = (torch.randn(rows, 49152, generator=gen) * 5).to(torch.bfloat16)  # bf16: ties are common
    logits[-1, 3] = logits[-1, 9000] = logits[-1].max()
    bf16, f32 = fused.greedy(logits), fused.greedy(logits.float())
    assert bf16 is not None and f32 is not None
    assert torch.equal(bf16[0], f32[0]) and torch.equal(bf16[0], logits.float().argmax(-1))
    assert bf16[0][-1].item() == 3
    assert torch.equal(bf16[1], f32[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_leaves_rows_with_nan_or_infinity_to_torch(dtype: torch.dtype) -> None:
    logits = torch.randn(3, 100).to(dtype)
    logits[1, 5] = float("nan")
    assert fused.greedy(logits) is None
    logits[1, 5] = float("inf")
    assert fused.greedy(logits) is None
    logits[1, 5] = float("-inf")  # a -inf logit is a token that cannot be chosen, not a NaN row
    greedy = fused.greedy(logits)
    assert greedy is not None and torch.equal(greedy[0], logits.float().argmax(-1))
