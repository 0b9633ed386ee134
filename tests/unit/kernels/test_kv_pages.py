"""The KV cache's storage formats (kernels/kv_pages.py): the int8 rule, writes and reads by slot, and attention on a
quantized cache against the reference on the same cache and on the unquantized values."""

from __future__ import annotations

import pytest
import torch
from paged_cases import BASE_SPECS, CaseSpec, build_case, naive_attention

from tgictl.kernels import attention, attention_reference
from tgictl.kernels.kv_pages import (
    Int8Pages,
    allocate_pages,
    dequantize_int8,
    gather_rows,
    pages_nbytes,
    quantize_int8,
    store_rows,
)
from tgictl.kv_cache_dtype import kv_bytes_per_head

CPU = torch.device("cpu")


def test_int8_rule_one_scale_per_row_and_half_a_step_of_error() -> None:
    rows = torch.randn(64, 3, 64) * torch.linspace(0.01, 30, 64)[:, None, None]
    values, scales = quantize_int8(rows)
    assert values.dtype == torch.int8 and scales.dtype == torch.bfloat16 and scales.shape == (64, 3)
    assert int(values.abs().max()) == 127  # the row's largest magnitude reaches the end of the range
    torch.testing.assert_close(scales, (rows.abs().amax(-1) / 127).to(torch.bfloat16), atol=0, rtol=0)
    error = (dequantize_int8(values, scales, torch.float32) - rows).abs()
    # half a step, plus what clamping the largest value costs when bf16 rounded its scale down (< 2^-8 of it)
    assert bool((error <= scales.float()[..., None] * 0.5 + rows.abs().amax(-1, keepdim=True) * 2**-8).all())


def test_int8_rule_zero_and_tied_rows() -> None:
    rows = torch.zeros(2, 1, 8)
    rows[1, 0, :4] = torch.tensor([1.0, -1.0, 0.5, -0.25])
    values, scales = quantize_int8(rows)
    assert values[0].abs().sum() == 0 and scales[0].item() == 0.0  # an all-zero row stays zero, no NaN
    expected_scale = torch.tensor(1 / 127).to(torch.bfloat16)
    assert scales[1, 0] == expected_scale
    quotient = rows[1, 0, :4] / expected_scale.float()
    assert values[1, 0, :4].tolist() == torch.round(quotient).clamp(-127, 127).to(torch.int8).tolist()


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8", "fp8_e4m3fn", "fp8_e5m2"])
def test_store_and_gather_by_slot(kv_cache_dtype: str) -> None:
    pages = allocate_pages(kv_cache_dtype, (5, 4, 2, 16), torch.bfloat16, CPU)
    assert pages.shape == (5, 4, 2, 16)
    rows = (torch.randn(3, 2, 16) * 4).to(torch.bfloat16)
    slots = torch.tensor([7, 0, 19])
    store_rows(rows, pages, slots)
    got = gather_rows(pages, slots, torch.float32)
    tolerance = {"auto": 0.0, "int8": 0.02, "fp8_e4m3fn": 0.07, "fp8_e5m2": 0.13}[kv_cache_dtype]
    assert bool(((got - rows.float()).abs() <= tolerance * rows.float().abs().amax(-1, keepdim=True)).all())
    untouched = gather_rows(pages, torch.tensor([1, 2, 18]), torch.float32)
    assert untouched.abs().sum() == 0  # nothing else written


def test_fp8_clamps_to_its_range() -> None:
    pages = allocate_pages("fp8_e5m2", (1, 2, 1, 4), torch.float32, CPU)
    store_rows(torch.tensor([[[1e6, -1e6, 3.0, 0.0]]]), pages, torch.tensor([1]))
    got = gather_rows(pages, torch.tensor([1]), torch.float32)
    assert got.tolist() == [[[57344.0, -57344.0, 3.0, 0.0]]]  # finite: no inf poisons a softmax


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8", "fp8_e4m3fn"])
def test_bytes_per_block_match_the_tensors(kv_cache_dtype: str) -> None:
    pages = allocate_pages(kv_cache_dtype, (3, 16, 4, 64), torch.bfloat16, CPU)
    assert pages_nbytes(pages) == 3 * 16 * 4 * kv_bytes_per_head(kv_cache_dtype, 64, 2)


def test_int8_holds_nearly_twice_the_tokens() -> None:
    for head_dim, ratio in ((64, 1.94), (128, 1.97)):
        bf16, int8 = kv_bytes_per_head("auto", head_dim, 2), kv_bytes_per_head("int8", head_dim, 2)
        assert bf16 / int8 == pytest.approx(ratio, abs=0.01)


@pytest.mark.parametrize("spec", BASE_SPECS, ids=CaseSpec.label)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_on_int8_cache_matches_the_reference(spec: CaseSpec, dtype: torch.dtype) -> None:
    case = build_case(spec, dtype, "int8")
    assert isinstance(case.key_cache, Int8Pages)
    args = (case.query, case.key_cache, case.value_cache, case.meta, case.scale)
    fast, reference = attention(*args), attention_reference(*args)
    # the same dequantized values on both paths: float32 exact to its rounding, bf16 within two roundings
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(fast.float(), reference.float(), **tol)


@pytest.mark.parametrize("spec", BASE_SPECS[:6], ids=CaseSpec.label)
def test_int8_cache_costs_little_accuracy(spec: CaseSpec) -> None:
    """Attention over the int8 cache against attention over the values as written (float32): the stated
    tolerance of the format on unit-normal K and V, 0.05 absolute (outputs are ~0.3-1 in size)."""
    case = build_case(spec, torch.float32, "int8")
    quantized = attention_reference(case.query, case.key_cache, case.value_cache, case.meta, case.scale)
    torch.testing.assert_close(quantized, naive_attention(case), atol=0.05, rtol=0.0)
