"""csrc/gguf_q6_k_rows.c: Q6_K blocks multiplied by bf16 rows straight from the blocks (1-4 rows) and decoded to
bf16 for the many-row strips (5+ rows), against the float32 matmul on gguf_types.py's reference dequantization."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tgictl.kernels.linear_methods import BLOCK_TYPES, GGUFWeight
from tgictl.kernels.linear_methods.native import QuantKernels, quant_kernels
from tgictl.testing.gguf_blocks import quantized_blocks

Q6_K = BLOCK_TYPES["Q6_K"]


def _kernels() -> QuantKernels:
    kernels = quant_kernels()
    if kernels is None or not kernels.q6_k_rows_built:
        pytest.skip("needs the native library built with AVX512-BF16 (csrc/gguf_q6_k_rows.c)")
    return kernels


def _weight(out_features: int, in_features: int, seed: int) -> GGUFWeight:
    w = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed)) * 0.05
    w[3] *= 40  # a row whose sub-block scales are far from the others'
    data = quantized_blocks("Q6_K", w.numpy(), np.random.default_rng(seed))
    return GGUFWeight(torch.from_numpy(data), Q6_K, in_features, torch.bfloat16)


# 131 rows: an odd split between threads; 2048 columns: 8 blocks, as in Llama-3.2-1B's head
@pytest.mark.parametrize("shape", [(131, 256), (64, 2048)], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 16])
def test_products_equal_the_float32_matmul_on_the_reference_weights(shape: tuple[int, int], rows: int) -> None:
    """1-4 rows: the weights as the reference's float32 values, the output rounded once to bf16 (within one bf16
    rounding of the output plus float32 sums); 5+ rows: the strips' bf16 weights (one more bf16 rounding)."""
    kernels = _kernels()
    weight = _weight(*shape, seed=rows)
    generator = torch.Generator().manual_seed(100 + rows)
    x = torch.randn(rows, shape[1], generator=generator).bfloat16()
    bias = torch.randn(shape[0], generator=generator)
    for b in (None, bias):
        out = kernels.gguf_bf16_linear(x, weight.data, Q6_K.native_id, shape[1], b)
        assert out is not None and out.dtype == torch.bfloat16 and out.shape == (rows, shape[0])
        reference = weight.dequantize()
        expected = F.linear(x.float(), reference, b)
        magnitude = float((x.float().abs() @ reference.abs().t()).max()) + (0.0 if b is None else float(b.abs().max()))
        weights_rounded = rows > 4
        torch.testing.assert_close(out.float(), expected, rtol=2**-8,
                                   atol=(2**-8 if weights_rounded else 1e-5) * magnitude)
        if weights_rounded:
            on_bf16 = F.linear(x.float(), reference.bfloat16().float(), b)
            torch.testing.assert_close(out.float(), on_bf16, rtol=2**-8, atol=1e-5 * magnitude)


def test_the_strips_decode_the_reference_values_bit_for_bit() -> None:
    """The vector decoder's bf16 weights are the reference's float32 values rounded to nearest even: one-hot rows
    (32 at a time, the strips' path) read them back exactly."""
    kernels = _kernels()
    weight = _weight(40, 512, seed=7)
    eye = torch.eye(512).bfloat16()
    columns = [kernels.gguf_bf16_linear(eye[i : i + 32], weight.data, Q6_K.native_id, 512, None) for i in range(0, 512, 32)]
    assert all(c is not None for c in columns)
    assert torch.equal(torch.cat(columns).t(), weight.dequantize().bfloat16())


def test_one_bf16_row_through_the_dispatch_takes_the_blocks_kernel() -> None:
    """The default order puts the float32 kernel first at 1-4 rows; for Q6_K in bf16 it hands the call to the
    kernel on the blocks (the float32 kernel's result differs from it: x is widened and its output rounded)."""
    kernels = _kernels()
    weight = _weight(131, 512, seed=3)
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(4)).bfloat16()
    direct = kernels.gguf_bf16_linear(x, weight.data, Q6_K.native_id, 512, None)
    assert direct is not None and torch.equal(weight(x), direct)
    float32_kernel = kernels.gguf_linear(x.float(), weight.data, Q6_K.native_id, 512, None)
    assert float32_kernel is not None
    torch.testing.assert_close(direct.float(), float32_kernel, rtol=2**-8, atol=1e-3)
