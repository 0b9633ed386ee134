"""The compiled decode-attention kernel: built on this machine, equal to the torch ops and the reference
on decode batches (NaN-filled caches prove it never reads padding), cached builds, clean fallbacks."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from paged_cases import CaseSpec, build_case

from tgictl.kernels import attention_reference
from tgictl.kernels.attention_fast import decode_attention, decode_attention_torch
from tgictl.kernels.linear import SMALL_LINEAR_MAX_ROWS
from tgictl.kernels.native import _bind, _build, load_native_kernels

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}
DECODE_SPECS = [
    CaseSpec(((5, 1), (0, 1), (17, 1)), block_size=4, heads=4, kv_heads=2, head_dim=8),
    CaseSpec(((255, 1),) * 4 + ((3, 1),), block_size=16, heads=9, kv_heads=3, head_dim=64),  # SmolLM2's layout
    CaseSpec(((30, 1), (1, 1)), block_size=1, heads=8, kv_heads=1, head_dim=32),  # MQA, one-token blocks
    CaseSpec(((12, 1), (40, 1)), block_size=8, heads=6, kv_heads=6, head_dim=16),  # MHA
    # the vector kernels' head sizes, with more query heads per KV head than one pass over V holds
    CaseSpec(((70, 1), (33, 1), (1, 1)), block_size=16, heads=16, kv_heads=2, head_dim=64),
    CaseSpec(((50, 1), (17, 1)), block_size=16, heads=8, kv_heads=2, head_dim=128),
    CaseSpec(((9, 1),), block_size=4, heads=7, kv_heads=1, head_dim=128),
]


def test_the_kernel_builds_here() -> None:
    # The development and CI machines have gcc: the native path must be the one that runs there.
    assert load_native_kernels() is not None


@pytest.mark.parametrize("spec", DECODE_SPECS, ids=CaseSpec.label)
@pytest.mark.parametrize("softcap", [None, 1.5])
def test_native_decode_matches_torch_and_reference(spec: CaseSpec, softcap: float | None) -> None:
    kernels = load_native_kernels()
    assert kernels is not None
    for dtype, tol in ((torch.float32, {"atol": 1e-5, "rtol": 1e-5}), (torch.bfloat16, BF16_TOL)):
        case = build_case(spec, dtype)
        plan = case.meta.decode
        assert plan is not None
        args = (case.key_cache, case.value_cache, plan.slots, plan.context_lens, plan.max_context_len,
                case.scale, softcap)
        native = kernels.paged_decode(case.query, *args)
        assert native is not None and native.dtype == dtype and native.shape == case.query.shape
        assert torch.isfinite(native).all()  # padding and unwritten (NaN) slots never read
        torch_ops = decode_attention_torch(case.query, case.key_cache, case.value_cache, plan, case.scale, softcap)
        reference = attention_reference(case.query, case.key_cache, case.value_cache, case.meta, case.scale, softcap)
        torch.testing.assert_close(native.float(), reference.float(), **tol)
        torch.testing.assert_close(native.float(), torch_ops.float(), **tol)
        # the dispatching entry point takes the native path on CPU
        dispatched = decode_attention(case.query, case.key_cache, case.value_cache, plan, case.scale, softcap)
        assert torch.equal(dispatched, native)


def test_bf16_output_is_the_rounded_float32_result() -> None:
    kernels = load_native_kernels()
    assert kernels is not None
    case32 = build_case(DECODE_SPECS[1], torch.float32)
    case16 = build_case(DECODE_SPECS[1], torch.bfloat16)
    plan = case16.meta.decode
    assert plan is not None
    out16 = kernels.paged_decode(case16.query, case16.key_cache, case16.value_cache, plan.slots, plan.context_lens,
                                 plan.max_context_len, case16.scale, None)
    # the same bf16 inputs computed in float32 by the float32 kernel, then rounded once: the bf16 kernel sums
    # in another order (csrc/paged_decode.c), so its float32 result may round to the neighbouring bf16 value
    out32 = kernels.paged_decode(case16.query.float(), case16.key_cache.float(), case16.value_cache.float(),
                                 plan.slots, plan.context_lens, plan.max_context_len, case16.scale, None)
    assert out16 is not None and out32 is not None and case32.query.shape == out16.shape
    rounded = out32.to(torch.bfloat16)
    ulp = (rounded.float().abs() * 2.0**-7).clamp_min(2.0**-126)  # one bf16 step at each value
    assert ((out16.float() - rounded.float()).abs() <= ulp).all()
    assert (out16 == rounded).float().mean() > 0.95  # nearly always the same rounding


def test_other_inputs_are_left_to_torch() -> None:
    kernels = load_native_kernels()
    assert kernels is not None
    case = build_case(DECODE_SPECS[0], torch.float16)
    plan = case.meta.decode
    assert plan is not None
    args = (plan.slots, plan.context_lens, plan.max_context_len, case.scale, None)
    assert kernels.paged_decode(case.query, case.key_cache, case.value_cache, *args) is None  # float16
    q = build_case(DECODE_SPECS[0]).query
    strided = torch.cat([q, q], dim=-1)[..., : q.shape[-1]]
    assert kernels.paged_decode(strided, case.key_cache.float(), case.value_cache.float(), *args) is None
    # the dispatcher still answers (torch ops) for float16
    out = decode_attention(case.query, case.key_cache, case.value_cache, plan, case.scale)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()


def test_builds_are_cached_per_source_compiler_and_cpu(tmp_path: Path) -> None:
    first = _build("cc", tmp_path)
    stamp = first.stat().st_mtime_ns
    assert _build("cc", tmp_path) == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left behind


def test_unavailable_compiler_or_switch_falls_back(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TGICTL_NATIVE_KERNELS", "0")
    assert load_native_kernels.__wrapped__() is None
    monkeypatch.delenv("TGICTL_NATIVE_KERNELS")
    monkeypatch.setenv("CC", "tgictl-no-such-compiler")
    with caplog.at_level(logging.WARNING):
        assert load_native_kernels.__wrapped__() is None
    assert "no C compiler (tgictl-no-such-compiler) found" in caplog.text
    monkeypatch.setenv("CC", "false")  # exists, fails
    with caplog.at_level(logging.WARNING):
        assert load_native_kernels.__wrapped__() is None
    assert "native CPU kernels unavailable" in caplog.text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 4, 6])
# (out, in): columns past the last 32-column chunk, an odd split of output rows between threads, a chunk-exact row
@pytest.mark.parametrize("shape", [(300, 70), (301, 64), (7, 33)])
def test_small_linear_matches_torch(dtype: torch.dtype, rows: int, shape: tuple[int, int]) -> None:
    kernels = load_native_kernels()
    assert kernels is not None
    generator = torch.Generator().manual_seed(rows)
    n, k = shape
    weight = torch.randn(n, k, generator=generator).to(dtype)
    bias = torch.randn(n, generator=generator).to(dtype)
    x = torch.randn(rows, k, generator=generator).to(dtype)
    for b in (None, bias):
        out = kernels.small_linear(x, weight, b)
        assert out is not None and out.dtype == dtype and out.shape == (rows, n)
        # the same products summed in float32 (torch's bf16 matmul also accumulates in float32)
        expected = torch.nn.functional.linear(x.float(), weight.float(), None if b is None else b.float())
        tol = {"atol": 1e-4, "rtol": 1e-5} if dtype == torch.float32 else BF16_TOL
        torch.testing.assert_close(out.float(), expected, **tol)
        if dtype == torch.bfloat16:  # each row's sums do not depend on the rows beside it (batch invariance)
            for i in range(rows):
                alone = kernels.small_linear(x[i:i + 1], weight, b)
                assert alone is not None and torch.equal(out[i:i + 1], alone)


@pytest.mark.parametrize("march", ["haswell", "x86-64"])  # AVX2-only CPUs (float32 is their default) and SSE
def test_small_linear_on_builds_without_avx512(tmp_path: Path, march: str) -> None:
    """The same kernels compiled for CPUs without AVX-512, where the 16-float vectors span several registers."""
    kernels = _bind(_build("cc", tmp_path, march=march))
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(301, 70, generator=generator)
    bias = torch.randn(301, generator=generator)
    for rows in (1, 3, 6):
        x = torch.randn(rows, 70, generator=generator)
        for dtype, tol in ((torch.float32, {"atol": 1e-4, "rtol": 1e-5}), (torch.bfloat16, BF16_TOL)):
            out = kernels.small_linear(x.to(dtype), weight.to(dtype), bias)
            assert out is not None and out.dtype == dtype
            expected = torch.nn.functional.linear(x.to(dtype).float(), weight.to(dtype).float(), bias)
            torch.testing.assert_close(out.float(), expected, **tol)


def test_small_linear_bf16_weight_float32_rows() -> None:
    """float32 activations on bf16 weights: read and returned as float32, the same sums."""
    kernels = load_native_kernels()
    assert kernels is not None
    weight = torch.randn(96, 96).to(torch.bfloat16)
    x = torch.randn(2, 96)
    out = kernels.small_linear(x, weight, None)
    assert out is not None and out.dtype == torch.float32
    torch.testing.assert_close(out, x @ weight.float().T, atol=1e-4, rtol=1e-5)


def test_linear_dispatch_uses_native_for_few_rows_only() -> None:
    from tgictl.kernels.linear import linear, matrix_vector_max_rows

    kernels = load_native_kernels()
    assert kernels is not None
    limit = matrix_vector_max_rows(torch.bfloat16)
    weight = torch.randn(64, 32).to(torch.bfloat16)
    few = torch.randn(limit, 32).to(torch.bfloat16)
    many = torch.randn(limit + 1, 32).to(torch.bfloat16)
    assert torch.equal(linear(few, weight), kernels.small_linear(few, weight, None))
    if limit == SMALL_LINEAR_MAX_ROWS[torch.bfloat16]:
        assert torch.equal(linear(many, weight), torch.nn.functional.linear(many, weight))
    assert kernels.small_linear(few, weight.t(), None) is None  # a transposed view: torch takes it
    half = few.half()
    assert torch.equal(linear(half, weight.half()), torch.nn.functional.linear(half, weight.half()))


def test_bf16_matrix_vector_rows_end_where_vdpbf16ps_takes_over() -> None:
    """On CPUs with AVX512-BF16 and no AMX, bf16 products of 2-4 rows run the VDPBF16PS kernel (it beat the
    matrix-vector kernel there, kernels/linear.py); elsewhere the matrix-vector kernel keeps 1-4 rows."""
    from tgictl.kernels.linear import amx_available, dpbf16_linear_available, linear, matrix_vector_max_rows

    kernels = load_native_kernels()
    assert kernels is not None
    zen_like = dpbf16_linear_available() and not amx_available()
    assert matrix_vector_max_rows(torch.bfloat16) == (1 if zen_like else SMALL_LINEAR_MAX_ROWS[torch.bfloat16])
    assert matrix_vector_max_rows(torch.float32) == SMALL_LINEAR_MAX_ROWS[torch.float32]
    weight = (torch.randn(200, 1024) * 0.05).to(torch.bfloat16)
    for rows in range(1, 5):
        x = torch.randn(rows, 1024).to(torch.bfloat16)
        expected = kernels.small_linear(x, weight, None) if rows == 1 or not zen_like \
            else kernels.dpbf16_linear(x, weight, None)
        assert torch.equal(linear(x, weight), expected)
        torch.testing.assert_close(linear(x, weight).float(), x.float() @ weight.float().T, atol=2e-2, rtol=2e-2)
