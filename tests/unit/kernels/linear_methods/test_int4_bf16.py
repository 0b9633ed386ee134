"""The int4 many-row kernel (csrc/int4_bf16.c): each tile dequantized once to bf16, then AMX or AVX512-BF16
dot products. Its result is the float32 matmul on the bf16-rounded dequantized weights, up to the order of
float32 sums and one final bf16 rounding, at row counts around its 16- and 32-row blocks, ragged output rows
(tiles of 64 partly filled) and columns padded to the tiles' K; this CPU uses its best instructions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tgictl.kernels.linear_methods import BLOCK_TYPES, GGUFWeight, Int4Weight
from tgictl.kernels.linear_methods.gguf_repack import as_int4_tiles
from tgictl.kernels.linear_methods.native import QuantKernels, quant_kernels
from tgictl.kernels.native import cpu_flags
from tgictl.testing.gguf_blocks import quantized_blocks


def _expected_instructions() -> str:
    flags = set(cpu_flags().split())
    return "amx" if "amx_bf16" in flags else "avx512-bf16" if "avx512_bf16" in flags else "none"


def check_against_bf16_weights(kernels: QuantKernels, weight: Int4Weight, rows: int, seed: int) -> None:
    """kernels' int4_bf16_linear on `rows` random rows equals x @ bf16(W)^T + bias within its rounding (on a
    CPU without bf16 dot products: it declines)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, weight.in_features, generator=generator).bfloat16()
    bias = torch.randn(weight.out_features, generator=generator)
    out = kernels.int4_bf16_linear(x, weight.packed, weight.scales_zeros, weight.group_size, weight.out_features,
                                   bias)
    if _expected_instructions() == "none":
        assert out is None
        return
    assert out is not None and out.dtype == torch.bfloat16 and out.shape == (rows, weight.out_features)
    w16 = weight.dequantize().bfloat16().float()
    expected = torch.nn.functional.linear(x.float(), w16, bias)
    bound = float((x.float().abs() @ w16.abs().t() + bias.abs()).max())
    torch.testing.assert_close(out.float(), expected, rtol=2**-8, atol=1e-5 * bound)


def test_this_cpu_multiplies_with_its_best_instructions() -> None:
    kernels = quant_kernels()
    assert kernels is not None
    assert kernels.int4_bf16_instructions == _expected_instructions()


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 31, 32, 33, 64, 100])
@pytest.mark.parametrize("shape, group", [((200, 512), 32), ((130, 99), 32), ((64, 256), 128), ((576, 1536), 64)],
                         ids=["200x512-g32", "130x99-g32", "64x256-g128", "576x1536-g64"])
def test_many_rows_equal_the_matmul_on_bf16_weights(rows: int, shape: tuple[int, int], group: int) -> None:
    kernels = quant_kernels()
    assert kernels is not None
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(rows)) * 0.05
    check_against_bf16_weights(kernels, Int4Weight.quantize(w, group, torch.bfloat16), rows, seed=rows)


def test_gguf_q4_tiles_go_through_it_too() -> None:
    kernels = quant_kernels()
    assert kernels is not None
    w = torch.randn(200, 512, generator=torch.Generator().manual_seed(2)) * 0.05
    for name in ("Q4_0", "Q4_1"):
        data = quantized_blocks(name, w.numpy(), np.random.default_rng(3))
        tiles = as_int4_tiles(GGUFWeight(torch.from_numpy(data), BLOCK_TYPES[name], 512, torch.bfloat16))
        assert isinstance(tiles, Int4Weight)
        check_against_bf16_weights(kernels, tiles, 40, seed=3)


def test_it_declines_float32_activations_and_scales() -> None:
    kernels = quant_kernels()
    assert kernels is not None
    weight = Int4Weight.quantize(torch.randn(64, 64), 32, torch.float32)
    x = torch.randn(8, 64)
    assert kernels.int4_bf16_linear(x, weight.packed, weight.scales_zeros, 32, 64, None) is None
    assert kernels.int4_bf16_linear(x.bfloat16(), weight.packed, weight.scales_zeros, 32, 64, None) is None
