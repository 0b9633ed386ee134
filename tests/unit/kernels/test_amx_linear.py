"""The AMX bf16 linear (csrc/amx_linear.c): y^T = W x^T on the weight as stored. Its result is the float32
matmul of the bf16 inputs up to the order of float32 sums and one final bf16 rounding, for row counts around
its 16- and 32-row tiles, output widths that leave partial tiles, and with and without bias; it declines an
input width that is not a multiple of 32 and, on a CPU without AMX, everything."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from tgictl.kernels.linear import (
    AMX_LINEAR_MAX_ROWS,
    DPBF16_LINEAR_MAX_ROWS,
    amx_available,
    dpbf16_linear_available,
    linear,
    uses_amx,
)
from tgictl.kernels.native import cpu_flags, load_native_kernels


def test_amx_is_used_exactly_where_the_cpu_has_it() -> None:
    assert amx_available() == ("amx_bf16" in cpu_flags().split())


@pytest.mark.parametrize("rows", [1, 5, 15, 16, 17, 31, 32, 33, 64])
@pytest.mark.parametrize("out_in", [(96, 64), (200, 576), (49, 96), (17, 1536)], ids=str)
@pytest.mark.parametrize("with_bias", [False, True])
def test_it_equals_the_float32_matmul_of_its_inputs(rows: int, out_in: tuple[int, int], with_bias: bool) -> None:
    native = load_native_kernels()
    assert native is not None
    generator = torch.Generator().manual_seed(rows * 7 + out_in[0])
    n, k = out_in
    x = torch.randn(rows, k, generator=generator).bfloat16()
    w = (torch.randn(n, k, generator=generator) * 0.05).bfloat16()
    bias = torch.randn(n, generator=generator) if with_bias else None
    out = native.amx_linear(x, w, bias)
    if not amx_available():
        assert out is None
        return
    assert out is not None and out.dtype == torch.bfloat16 and out.shape == (rows, n)
    expected = F.linear(x.float(), w.float(), bias)
    bound = float((x.float().abs() @ w.float().abs().t()).max()) + (0.0 if bias is None else float(bias.abs().max()))
    torch.testing.assert_close(out.float(), expected, rtol=2**-8, atol=1e-5 * bound)


def test_it_declines_widths_that_are_not_a_multiple_of_32_and_linear_falls_back() -> None:
    native = load_native_kernels()
    assert native is not None
    x = torch.randn(8, 100).bfloat16()
    w = torch.randn(40, 100).bfloat16()
    assert native.amx_linear(x, w, None) is None
    assert native.amx_linear(x.float(), w.float(), None) is None  # float32: not this kernel's
    torch.testing.assert_close(linear(x, w).float(), F.linear(x, w).float(), rtol=2**-7, atol=1e-2)


def test_linear_routes_5_to_32_bf16_rows_to_it() -> None:
    for rows, expected in ((4, False), (5, True), (AMX_LINEAR_MAX_ROWS, True), (AMX_LINEAR_MAX_ROWS + 1, False)):
        x = torch.zeros(rows, 64, dtype=torch.bfloat16)
        assert uses_amx(x) == (expected and amx_available())
        assert not uses_amx(x.float())


def check_many_rows(linear_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None], w16: torch.Tensor,
                    dpbf16_in_parts: bool = False) -> None:
    """linear_fn(x, bias) at 5, 32, 33 and 100 rows equals the float32 matmul on the bf16 weights w16 [out, in]
    within the output's rounding; where there is no AMX it takes csrc/dpbf16_linear.c up to 32 rows (where the
    CPU has AVX512-BF16) and declines the rest, or with `dpbf16_in_parts` takes them 32 rows at a time."""
    out_features, in_features = w16.shape
    for rows in (5, 32, 33, 100):
        x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows)).bfloat16()
        bias = torch.randn(out_features, generator=torch.Generator().manual_seed(rows + 1))
        out = linear_fn(x, bias)
        dpbf16_takes = dpbf16_linear_available() and (dpbf16_in_parts or rows <= DPBF16_LINEAR_MAX_ROWS)
        if not (amx_available() or dpbf16_takes):
            assert out is None
            continue
        assert out is not None and out.shape == (rows, out_features) and out.dtype == torch.bfloat16
        expected = F.linear(x.float(), w16, bias)
        bound = float((x.float().abs() @ w16.abs().t() + bias.abs()).max())
        torch.testing.assert_close(out.float(), expected, rtol=2**-8, atol=1e-5 * bound)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_gguf_rows_decoded_for_it_equal_the_matmul_on_bf16_weights(type_name: str) -> None:
    """linear_methods/gguf_weight.py's many-row backend: each strip of 32 rows decoded to bf16 (Q8_0 by its
    own vector path, the others through their float32 decoders), then this kernel's strip product."""
    import numpy as np

    from tgictl.kernels.linear_methods import BLOCK_TYPES, GGUFWeight
    from tgictl.kernels.linear_methods.native import quant_kernels
    from tgictl.testing.gguf_blocks import quantized_blocks

    kernels = quant_kernels()
    assert kernels is not None
    w = torch.randn(200, 512, generator=torch.Generator().manual_seed(5)) * 0.05  # 200: a partial last strip
    data = torch.from_numpy(quantized_blocks(type_name, w.numpy(), np.random.default_rng(6)))
    weight = GGUFWeight(data, BLOCK_TYPES[type_name], 512, torch.bfloat16)
    check_many_rows(lambda x, bias: kernels.gguf_bf16_linear(x, data, weight.block_type.native_id, 512, bias),
                    weight.dequantize().bfloat16().float())


def test_int8_rows_decoded_for_it_equal_the_matmul_on_bf16_weights() -> None:
    """linear_methods/int8.py's many-row backend: each strip of int8 rows times its scale in bf16, then this
    kernel's strip product."""
    from tgictl.kernels.linear_methods import Int8Weight
    from tgictl.kernels.linear_methods.native import quant_kernels

    kernels = quant_kernels()
    assert kernels is not None
    weight = Int8Weight.quantize(torch.randn(200, 576, generator=torch.Generator().manual_seed(8)) * 0.05,
                                 torch.bfloat16)
    check_many_rows(lambda x, bias: kernels.int8_bf16_linear(x, weight.qweight, weight.scales, bias),
                    weight.dequantize().bfloat16().float(), dpbf16_in_parts=True)
