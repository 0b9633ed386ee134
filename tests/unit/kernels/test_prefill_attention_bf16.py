"""csrc/prefill_attention_bf16.c and prefill_attention_amx.c, causal prefill attention in bf16 on AVX512-BF16 and on
AMX CPUs: each kernel gives the float32 reference's result (and SDPA's, within bf16 rounding) for prompts with and
without a cached prefix, lengths around their blocks of 16 queries and 64 keys, group sizes 1-9, head sizes 64 and
128; prefill_attention dispatches to the AMX kernel where the CPU has AMX, else to the AVX512-BF16 one; softcapping,
other head sizes and builds without them take SDPA and still match."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
from paged_cases import CaseSpec, build_case, naive_attention

from tgictl.kernels.attention_fast import prefill_attention, prefill_attention_torch
from tgictl.kernels.native import _bind, _build, cpu_flags, load_native_kernels

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}
HAS_BF16_DOT = "avx512_bf16" in cpu_flags().split()
HAS_AMX = "amx_bf16" in cpu_flags().split()
KERNELS = [
    pytest.param("prefill_bf16", marks=pytest.mark.skipif(not HAS_BF16_DOT, reason="this CPU has no AVX512-BF16")),
    pytest.param("prefill_amx", marks=pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX")),
]


def _prefill(spec: CaseSpec, kernels=None, kernel: str | None = None) -> tuple[torch.Tensor | None, torch.Tensor,
                                                                              torch.Tensor]:
    """(the native kernel's output or None, SDPA's, the float32 reference's) for the spec's one prompt; `kernel`
    names one kernel of NativeKernels, else prefill_attention's choice."""
    case = build_case(spec, torch.bfloat16)
    (plan,) = case.meta.prefill
    query = case.query[plan.query_start : plan.query_end]
    kernels = kernels if kernels is not None else load_native_kernels()
    args = (query, case.key_cache, case.value_cache, plan.slots, plan.cache_len, case.scale)
    native = kernels.prefill_attention(*args) if kernel is None \
        else kernels.prefill_attention_with((getattr(kernels, kernel),), *args)
    sdpa = prefill_attention_torch(query, case.key_cache, case.value_cache, plan, case.scale)
    return native, sdpa, naive_attention(case)[plan.query_start : plan.query_end]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("cache_len, new_len", [(0, 2), (0, 15), (0, 17), (0, 64), (0, 130), (5, 3), (40, 50),
                                                (200, 70), (63, 2), (64, 64), (0, 300)])
def test_prompts_with_and_without_a_prefix_match_the_reference(kernel: str, cache_len: int, new_len: int) -> None:
    native, sdpa, reference = _prefill(CaseSpec(((cache_len, new_len),), block_size=16, heads=9, kv_heads=3,
                                                head_dim=64, seed=cache_len + new_len), kernel=kernel)
    assert native is not None
    torch.testing.assert_close(native.float(), reference, **BF16_TOL)
    torch.testing.assert_close(native.float(), sdpa.float(), **BF16_TOL)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (8, 4), (9, 3), (8, 2), (5, 1), (9, 1)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_group_size_and_head_size(kernel: str, heads: int, kv_heads: int, head_dim: int) -> None:
    native, _, reference = _prefill(CaseSpec(((21, 45),), block_size=8, heads=heads, kv_heads=kv_heads,
                                             head_dim=head_dim, seed=heads * head_dim), kernel=kernel)
    assert native is not None
    torch.testing.assert_close(native.float(), reference, **BF16_TOL)


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX")
def test_a_context_too_long_for_the_amx_layout_goes_to_the_avx512_kernel() -> None:
    """16K cached keys of 8 KV heads of 128: the AMX kernel's per-call layout would pass 64 MiB."""
    spec = CaseSpec(((16384, 2),), block_size=64, heads=8, kv_heads=8, head_dim=128, seed=3)
    kernels = load_native_kernels()
    amx, sdpa, _ = _prefill(spec, kernels, kernel="prefill_amx")
    assert amx is None
    native, _, _ = _prefill(spec, kernels)
    assert native is not None
    torch.testing.assert_close(native.float(), sdpa.float(), **BF16_TOL)


@pytest.mark.skipif(not HAS_BF16_DOT, reason="this CPU has no AVX512-BF16")
def test_prefill_attention_dispatches_to_the_kernel() -> None:
    case = build_case(CaseSpec(((10, 30),), block_size=16, heads=9, kv_heads=3, head_dim=64), torch.bfloat16)
    (plan,) = case.meta.prefill
    query = case.query[plan.query_start : plan.query_end]
    kernels = load_native_kernels()
    native = kernels.prefill_attention_with((kernels.prefill_amx if HAS_AMX else kernels.prefill_bf16,), query,
                                            case.key_cache, case.value_cache, plan.slots, plan.cache_len, case.scale)
    assert native is not None
    assert torch.equal(prefill_attention(query, case.key_cache, case.value_cache, plan, case.scale), native)
    # softcapping is SDPA-free torch code, not the kernel (which would ignore the cap: far off at a cap of 2).
    # Within rounding, not bit for bit: oneDNN's bf16 matmuls on AMX CPUs are not always bit-reproducible
    # from one call to the next (a first call in a process once differed in its last bits).
    capped = prefill_attention(query, case.key_cache, case.value_cache, plan, case.scale, softcap=2.0)
    expected = prefill_attention_torch(query, case.key_cache, case.value_cache, plan, case.scale, softcap=2.0)
    torch.testing.assert_close(capped.float(), expected.float(), **BF16_TOL)
    assert (capped.float() - native.float()).abs().max().item() > 10 * BF16_TOL["atol"]


def test_other_head_sizes_and_dtypes_are_left_to_sdpa() -> None:
    kernels = load_native_kernels()
    assert kernels is not None
    native, sdpa, reference = _prefill(CaseSpec(((4, 20),), block_size=4, heads=4, kv_heads=2, head_dim=32), kernels)
    assert native is None  # head size 32
    torch.testing.assert_close(sdpa.float(), reference, **BF16_TOL)
    case = build_case(CaseSpec(((0, 20),), block_size=16, heads=4, kv_heads=2, head_dim=64), torch.float32)
    (plan,) = case.meta.prefill
    assert kernels.prefill_attention(case.query, case.key_cache, case.value_cache, plan.slots, 0, case.scale) is None


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86-64 target")
def test_a_build_without_avx512_bf16_declines(tmp_path: Path) -> None:
    native, _, _ = _prefill(CaseSpec(((0, 20),), block_size=16, heads=9, kv_heads=3, head_dim=64),
                            _bind(_build("cc", tmp_path, march="haswell")))
    assert native is None


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86-64 target")
def test_a_build_without_amx_declines_the_amx_kernel(tmp_path: Path) -> None:
    """-march=sapphirerapids -mno-amx-tile: AVX512-BF16 without AMX, as on AMD Zen 4."""
    kernels = _bind(_build("cc", tmp_path, march="sapphirerapids", extra_flags=("-mno-amx-tile",)))
    native, _, _ = _prefill(CaseSpec(((0, 20),), block_size=16, heads=9, kv_heads=3, head_dim=64), kernels,
                            kernel="prefill_amx")
    assert native is None
