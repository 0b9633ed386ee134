"""csrc/prefill_attention_bf16.c's int8 entry (tgictl_prefill_attention_q8), causal prefill attention over an int8 KV
cache: bit for bit the bf16 kernel's result on the cache widened to bf16 (kv_pages.gather_rows' values), for prompts
with and without a cached prefix, every group size, head sizes 64 and 128, sliding windows; within bf16 rounding of the
reference (the int8 bytes dequantized to float32, float32 attention); prefill_attention dispatches int8 caches to it;
a build without AVX512-BF16 declines and the torch path serves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from paged_cases import CaseSpec, build_case

from tgictl.kernels.attention_fast import prefill_attention, prefill_attention_torch
from tgictl.kernels.kv_pages import Int8Pages, dequantize_int8
from tgictl.kernels.native import _bind, _build, cpu_flags, load_native_kernels, prefill_attention_int8

HAS_BF16_DOT = "avx512_bf16" in cpu_flags().split()
pytestmark = pytest.mark.skipif(not HAS_BF16_DOT, reason="this CPU has no AVX512-BF16")
# Against float32 attention on the same int8 bytes the kernel adds only bf16 roundings (each widened K and V
# element once, as the torch path does for bf16 models; p before p v; the output): the bf16 kernel's tolerance
# against its float32 reference (test_prefill_attention_bf16.py). The int8 rounding itself is in both.
BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}


def _widened(pages: Int8Pages) -> torch.Tensor:
    """The whole int8 cache as a bf16 cache of the same shape (every slot, NaN scales included)."""
    return dequantize_int8(pages.values, pages.scales, torch.bfloat16).contiguous()


def _both(spec: CaseSpec, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the int8 entry's output, the bf16 kernel's on the widened cache, float32 attention on the int8 bytes)."""
    case = build_case(spec, torch.bfloat16, "int8")
    (plan,) = case.meta.prefill
    query = case.query[plan.query_start : plan.query_end]
    kernels = load_native_kernels()
    assert kernels is not None
    q8 = prefill_attention_int8(kernels, query, case.key_cache, case.value_cache, plan.slots, plan.cache_len,
                                case.scale, window)
    assert q8 is not None
    bf16 = kernels.prefill_attention_with((kernels.prefill_bf16,), query, _widened(case.key_cache),
                                          _widened(case.value_cache), plan.slots, plan.cache_len, case.scale, window)
    assert bf16 is not None
    reference = prefill_attention_torch(query.float(), case.key_cache, case.value_cache, plan, case.scale)
    return q8, bf16, reference


@pytest.mark.parametrize("cache_len, new_len", [(0, 2), (0, 17), (0, 130), (5, 3), (40, 50), (200, 70), (63, 2),
                                                (64, 64), (0, 300)])
def test_prompts_with_and_without_a_prefix(cache_len: int, new_len: int) -> None:
    q8, bf16, reference = _both(CaseSpec(((cache_len, new_len),), block_size=16, heads=9, kv_heads=3, head_dim=64,
                                         seed=cache_len + new_len))
    assert torch.equal(q8, bf16)
    torch.testing.assert_close(q8.float(), reference, **BF16_TOL)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (9, 3), (8, 2), (9, 1)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_group_size_and_head_size(heads: int, kv_heads: int, head_dim: int) -> None:
    q8, bf16, reference = _both(CaseSpec(((21, 45),), block_size=8, heads=heads, kv_heads=kv_heads,
                                         head_dim=head_dim, seed=heads * head_dim))
    assert torch.equal(q8, bf16)
    torch.testing.assert_close(q8.float(), reference, **BF16_TOL)


@pytest.mark.parametrize("window", [1, 7, 64, 100])
def test_sliding_windows_equal_the_bf16_kernel(window: int) -> None:
    q8, bf16, _ = _both(CaseSpec(((90, 80),), block_size=16, heads=9, kv_heads=3, head_dim=64, seed=window),
                        window=window)
    assert torch.equal(q8, bf16)


def test_prefill_attention_dispatches_int8_caches_to_the_kernel() -> None:
    case = build_case(CaseSpec(((10, 30),), block_size=16, heads=9, kv_heads=3, head_dim=64), torch.bfloat16,
                      "int8")
    (plan,) = case.meta.prefill
    query = case.query[plan.query_start : plan.query_end]
    kernels = load_native_kernels()
    native = prefill_attention_int8(kernels, query, case.key_cache, case.value_cache, plan.slots, plan.cache_len,
                                    case.scale)
    assert native is not None
    assert torch.equal(prefill_attention(query, case.key_cache, case.value_cache, plan, case.scale), native)
    # float32 queries (the exactness path) and head sizes the kernel does not take stay on the torch path
    assert prefill_attention_int8(kernels, query.float(), case.key_cache, case.value_cache, plan.slots,
                                  plan.cache_len, case.scale) is None


def test_a_build_without_avx512_bf16_declines_and_the_torch_path_serves(tmp_path: Path) -> None:
    case = build_case(CaseSpec(((12, 20),), block_size=16, heads=9, kv_heads=3, head_dim=64), torch.bfloat16, "int8")
    (plan,) = case.meta.prefill
    query = case.query[plan.query_start : plan.query_end]
    haswell = _bind(_build("cc", tmp_path, march="haswell"))
    assert prefill_attention_int8(haswell, query, case.key_cache, case.value_cache, plan.slots, plan.cache_len,
                                  case.scale) is None
    reference = prefill_attention_torch(query.float(), case.key_cache, case.value_cache, plan, case.scale)
    torch.testing.assert_close(prefill_attention_torch(query, case.key_cache, case.value_cache, plan,
                                                       case.scale).float(), reference, **BF16_TOL)
