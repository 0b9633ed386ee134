"""Sliding-window attention (kernels/window.py): the reference, the dispatched torch and compiled paths (decode
rows, prompts with and without a cached prefix, chunks, the AVX512-BF16 prefill kernel around its blocks of 16
queries and 64 keys) all equal dense attention under the window mask; windows wider than every context change
nothing; the windowed view is built once per window and batch."""

from __future__ import annotations

import pytest
import torch
from paged_cases import BASE_SPECS, CaseSpec, build_case, naive_attention, random_spec

from tgictl.errors import InvalidRequestError
from tgictl.kernels import attention, attention_reference
from tgictl.kernels.attention_fast import decode_attention_torch, prefill_attention_torch
from tgictl.kernels.native import cpu_flags, load_native_kernels
from tgictl.kernels.window import windowed

F32_TOL = {"atol": 1e-5, "rtol": 1e-5}
BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}
WINDOWS = (1, 2, 3, 5, 8)
HAS_BF16_DOT = "avx512_bf16" in cpu_flags().split()


@pytest.mark.parametrize("spec", BASE_SPECS, ids=CaseSpec.label)
@pytest.mark.parametrize("window", WINDOWS)
def test_reference_and_fast_path_equal_dense_attention_under_the_window(spec: CaseSpec, window: int) -> None:
    case = build_case(spec)
    expected = naive_attention(case, window=window)
    args = (case.query, case.key_cache, case.value_cache, case.meta, case.scale)
    torch.testing.assert_close(attention_reference(*args, window=window), expected, **F32_TOL)
    torch.testing.assert_close(attention(*args, window=window), expected, **F32_TOL)


@pytest.mark.parametrize("seed", range(16))
def test_random_batches_with_softcap_in_float32_and_bf16(seed: int) -> None:
    spec = random_spec(seed)
    window = 1 + seed % 7
    softcap = None if seed % 2 else 1.5
    for dtype, tol in ((torch.float32, F32_TOL), (torch.bfloat16, BF16_TOL)):
        case = build_case(spec, dtype)
        args = (case.query, case.key_cache, case.value_cache, case.meta, case.scale, softcap)
        fast = attention(*args, window=window)
        assert torch.isfinite(fast.float()).all()  # padding and never-written (NaN) slots are not read
        torch.testing.assert_close(fast.float(), attention_reference(*args, window=window).float(), **tol)
        torch.testing.assert_close(fast.float(), naive_attention(case, softcap, window), **tol)


def test_the_window_changes_the_result_and_a_wide_one_does_not() -> None:
    case = build_case(CaseSpec(((12, 1), (3, 9)), block_size=4, seed=5))
    args = (case.query, case.key_cache, case.value_cache, case.meta, case.scale)
    full = attention(*args)
    assert not torch.allclose(attention(*args, window=4), full)
    assert windowed(case.meta, case.meta.max_context_len) is case.meta
    torch.testing.assert_close(attention(*args, window=case.meta.max_context_len), full, rtol=0, atol=0)


def test_the_windowed_view_is_built_once_per_window() -> None:
    meta = build_case(CaseSpec(((20, 1), (5, 9)), block_size=4)).meta
    view = windowed(meta, 4)
    assert windowed(meta, 4) is view and windowed(meta, 6) is not view
    decode = view.decode
    assert decode is not None and decode.context_lens.tolist() == [4] and decode.max_context_len == 4
    (prefill,) = view.prefill
    # the prompt's first query (position 5) sees from position 2 on: 3 cached keys before it in the view
    assert prefill.cache_len == 3 and prefill.window == 4 and prefill.slots.shape == (12,)
    assert prefill.mask is not None and prefill.mask.sum(dim=1).tolist() == [4] * 9
    with pytest.raises(InvalidRequestError, match="at least one position"):
        windowed(meta, 0)


@pytest.mark.parametrize("window", [1, 7, 16])
def test_native_decode_reads_only_the_window(window: int) -> None:
    kernels = load_native_kernels()
    assert kernels is not None
    spec = CaseSpec(((70, 1), (3, 1), (33, 1)), block_size=16, heads=8, kv_heads=2, head_dim=64, seed=window)
    for dtype, tol in ((torch.float32, F32_TOL), (torch.bfloat16, BF16_TOL)):
        case = build_case(spec, dtype)
        plan = windowed(case.meta, window).decode
        assert plan is not None
        native = kernels.paged_decode(case.query, case.key_cache, case.value_cache, plan.slots, plan.context_lens,
                                      plan.max_context_len, case.scale, None)
        assert native is not None
        torch_ops = decode_attention_torch(case.query, case.key_cache, case.value_cache, plan, case.scale)
        expected = naive_attention(case, window=window)
        torch.testing.assert_close(native.float(), expected, **tol)
        torch.testing.assert_close(torch_ops.float(), expected, **tol)


@pytest.mark.skipif(not HAS_BF16_DOT, reason="this CPU has no AVX512-BF16")
@pytest.mark.parametrize("cache_len, new_len, window", [
    (0, 130, 1), (0, 130, 17), (0, 130, 64), (0, 130, 65), (0, 300, 100), (40, 50, 30), (200, 70, 64),
    (200, 70, 129), (63, 2, 5), (5, 3, 4), (0, 17, 16), (100, 33, 200),
])
def test_the_avx512_prefill_kernel_applies_the_window(cache_len: int, new_len: int, window: int) -> None:
    kernels = load_native_kernels()
    assert kernels is not None
    spec = CaseSpec(((cache_len, new_len),), block_size=16, heads=9, kv_heads=3, head_dim=64, seed=window)
    case = build_case(spec, torch.bfloat16)
    (plan,) = windowed(case.meta, window).prefill
    query = case.query[plan.query_start : plan.query_end]
    native = kernels.prefill_attention_with((kernels.prefill_bf16,), query, case.key_cache, case.value_cache,
                                            plan.slots, plan.cache_len, case.scale, plan.window)
    assert native is not None
    expected = naive_attention(case, window=window)
    torch.testing.assert_close(native.float(), expected, **BF16_TOL)
    sdpa = prefill_attention_torch(query, case.key_cache, case.value_cache, plan, case.scale)
    torch.testing.assert_close(native.float(), sdpa.float(), **BF16_TOL)


@pytest.mark.skipif(not HAS_BF16_DOT, reason="this CPU has no AVX512-BF16")
def test_the_amx_kernel_declines_a_window() -> None:
    kernels = load_native_kernels()
    assert kernels is not None
    case = build_case(CaseSpec(((0, 40),), block_size=16, heads=4, kv_heads=2, head_dim=64), torch.bfloat16)
    (plan,) = windowed(case.meta, 8).prefill
    declined = kernels.prefill_attention_with((kernels.prefill_amx,), case.query, case.key_cache, case.value_cache,
                                              plan.slots, plan.cache_len, case.scale, plan.window)
    assert declined is None
