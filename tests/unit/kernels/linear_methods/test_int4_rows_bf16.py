"""The int4 kernel for 1-4 bf16 rows (csrc/int4_rows_bf16.c): nibbles turned into bf16 pairs in registers,
VDPBF16PS against the input rows' pairs. Its result is the float matmul on the dequantized weights up to the
order of float32 sums, for odd input widths (the last column's partner is padding), ragged tiles, every
group size the int4 format takes, and bias; int4_linear takes it for bf16 rows and keeps the float32 kernel
for float32 rows and for 5 rows and more. Builds without AVX512-BF16 decline it (test_quant_native_variants)."""

from __future__ import annotations

import pytest
import torch

from tgictl.kernels.linear_methods import Int4Weight
from tgictl.kernels.linear_methods.native import QuantKernels, int4_sz_form, quant_kernels
from tgictl.kernels.native import cpu_flags

pytestmark = pytest.mark.skipif(
    not {"avx512_bf16", "avx512vbmi"} <= set(cpu_flags().split()), reason="this CPU cannot run the kernel"
)


def _kernels() -> QuantKernels:
    kernels = quant_kernels()
    assert kernels is not None
    return kernels


def _direct(kernels: QuantKernels, x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None) -> tuple[int, torch.Tensor]:
    m, k = x.shape
    y = torch.full((m, weight.out_features), float("nan"))
    status = kernels.int4_rows_bf16(x.data_ptr(), weight.packed.data_ptr(), weight.scales_zeros.data_ptr(),
                                    int4_sz_form(weight.scales_zeros), weight.group_size, None if bias is None else bias.data_ptr(), y.data_ptr(), m,
                                    weight.out_features, k, weight.packed.shape[1], torch.get_num_threads())
    return status, y


@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (130, 77), (64, 33), (200, 130)])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_rows_match_the_float_matmul_on_the_dequantized_weights(shape: tuple[int, int], group: int, rows: int) -> None:
    n, k = shape
    generator = torch.Generator().manual_seed(n * rows + group)
    weight = Int4Weight.quantize(torch.randn(n, k, generator=generator) * 0.05, group, torch.bfloat16)
    x = torch.randn(rows, k, generator=generator).bfloat16()
    bias = torch.randn(n, generator=generator)
    status, y = _direct(_kernels(), x, weight, bias)
    assert status == 0
    w = weight.dequantize().double()
    expected = x.double() @ w.t() + bias.double()
    bound = float((x.double().abs() @ w.abs().t() + bias.double().abs()).max())  # float32 sums' error scale
    torch.testing.assert_close(y.double(), expected, rtol=0, atol=2e-6 * bound)


def test_int4_linear_takes_it_for_a_few_bf16_rows_only() -> None:
    kernels = _kernels()
    generator = torch.Generator().manual_seed(7)
    weight = Int4Weight.quantize(torch.randn(192, 96, generator=generator), 32, torch.bfloat16)
    x = torch.randn(5, 96, generator=generator).bfloat16()
    bias = torch.randn(192, generator=generator)
    for rows in (1, 4):
        out = kernels.int4_linear(x[:rows], weight.packed, weight.scales_zeros, 32, 192, bias)
        status, y = _direct(kernels, x[:rows].contiguous(), weight, bias)
        assert status == 0 and out is not None and torch.equal(out, y.bfloat16())
    assert _direct(kernels, x, weight, bias)[0] == -1  # 5 rows: the float32 kernel's business
    five = kernels.int4_linear(x, weight.packed, weight.scales_zeros, 32, 192, bias)
    assert five is not None
    # float32 rows keep the float32 kernel, whose sums run in another order: close, not equal bit for bit
    single = kernels.int4_linear(x[:1].float(), weight.packed, weight.scales_zeros, 32, 192, bias)
    assert single is not None and single.dtype == torch.float32
    torch.testing.assert_close(single, _direct(kernels, x[:1].contiguous(), weight, bias)[1], rtol=1e-5, atol=1e-4)
