"""GGUF Q4_0 / Q4_1 blocks as int4 tiles: the same weights as the file's (the `gguf` package's
dequantizer) in float32, within the bf16 rounding of the scales in bf16; other block types stay blocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tgictl.kernels.linear_methods import BLOCK_TYPES, GGUFWeight, Int4Weight
from tgictl.kernels.linear_methods.gguf_repack import as_int4_tiles, served_form
from tgictl.kernels.linear_methods.native import quant_kernels
from tgictl.testing.gguf_blocks import quantized_blocks


def _blocks(type_name: str, rows: int, cols: int, dtype: torch.dtype) -> tuple[GGUFWeight, np.ndarray]:
    rng = np.random.default_rng(rows * cols)
    weights = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    data = quantized_blocks(type_name, weights, rng)
    return GGUFWeight(torch.from_numpy(data), BLOCK_TYPES[type_name], cols, dtype), data


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize(("rows", "cols"), [(96, 576), (130, 64), (64, 1536)])  # rows not a tile multiple too
def test_float32_tiles_are_the_files_weights(type_name: str, rows: int, cols: int) -> None:
    weight, data = _blocks(type_name, rows, cols, torch.float32)
    tiles = as_int4_tiles(weight)
    assert isinstance(tiles, Int4Weight) and tiles.group_size == 32 and tiles.shape == (rows, cols)
    theirs = torch.from_numpy(gguf.quants.dequantize(data, getattr(gguf.GGMLQuantizationType, type_name)))
    # (q - 8) d + (m + 8 d) against d q + m: equal up to the rounding of m + 8 d in float32
    torch.testing.assert_close(tiles.dequantize(), theirs, rtol=0, atol=2e-7 * float(theirs.abs().max()))
    n_pad = -(-rows // 64) * 64  # half a byte per weight, a float32 scale (and Q4_1's zero) per 32, rows to 64
    assert tiles.nbytes == n_pad * cols // 2 + n_pad * cols // 32 * (1 if type_name == "Q4_0" else 2) * 4


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
def test_bfloat16_scales_round_once(type_name: str) -> None:
    weight, _ = _blocks(type_name, 128, 576, torch.bfloat16)
    tiles = as_int4_tiles(weight)
    # bf16 scales: 18 bytes per 32 weights for Q4_0 (no zero), 20 for Q4_1: the files' own blocks' sizes
    assert tiles.nbytes == 128 * 576 // 32 * (18 if type_name == "Q4_0" else 20)
    error = (tiles.dequantize() - weight.dequantize()).abs().max()
    # d and m + 8 d rounded to bf16 (relative 2^-9 each), times |q - 8| <= 8: well under 1% of the range
    assert 0 < float(error) <= 0.01 * float(weight.dequantize().abs().max())


def test_served_form_repacks_only_the_4_bit_groups() -> None:
    for type_name in sorted(BLOCK_TYPES):
        weight, _ = _blocks(type_name, 64, 512, torch.float32)
        served = served_form(weight)
        if type_name in ("Q4_0", "Q4_1"):  # for torch's int4 kernel (AVX-512 builds) or the C ones
            assert isinstance(served, Int4Weight)
        else:
            assert served is weight


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "cols"), [(130, 576), (64, 1536)])
def test_q4_0_without_zeros_multiplies_bit_for_bit_as_with_zeros_of_0(dtype: torch.dtype, rows: int,
                                                                       cols: int) -> None:
    """Q4_0's scales stored alone against the layout it replaces (a bf16 zero of 0 beside each scale): the same
    weights and, through every int4 kernel the dispatch offers at 1-9 rows (csrc/int4_rows_bf16.c at 1-4 bf16
    rows, quant_linear.c's float32 one, int4_bf16.c above 4), the same outputs bit for bit."""
    weight, _ = _blocks("Q4_0", rows, cols, dtype)
    alone, paired = as_int4_tiles(weight, zero_for_q4_0=False), as_int4_tiles(weight, zero_for_q4_0=True)
    assert not alone.has_zeros and paired.has_zeros and alone.nbytes < paired.nbytes
    assert torch.equal(alone.dequantize(), paired.dequantize())
    picked = torch.tensor([0, 5, rows - 1])
    assert torch.equal(alone.dequantize_rows(picked), paired.dequantize_rows(picked))
    generator = torch.Generator().manual_seed(rows)
    bias = torch.randn(rows, generator=generator, dtype=dtype)
    for m in range(1, 10):
        x = torch.randn(m, cols, generator=generator).to(dtype)
        for name in ("native", "native_bf16"):
            ours, theirs = alone.backends()[name](alone, x, bias), paired.backends()[name](paired, x, bias)
            assert (ours is None) == (theirs is None), (name, m)
            if ours is not None:
                assert torch.equal(ours, theirs), (name, m)
                expected = torch.nn.functional.linear(x.float(), paired.dequantize(), bias.float())
                # and both the matmul on the dequantized weights, up to bf16's rounding of the output (and of
                # the weights, on the many-row kernel) or float32's order of additions
                tolerance = (2**-6 if dtype == torch.bfloat16 else 1e-5) * float(expected.abs().max())
                torch.testing.assert_close(ours.float(), expected, rtol=0, atol=tolerance)
    assert alone.backends()["torch"](alone, x, bias) is None  # torch's kernel reads (scale, zero) pairs


def test_q4_0_keeps_zeros_only_where_no_c_kernel_reads_it() -> None:
    weight, _ = _blocks("Q4_0", 64, 512, torch.bfloat16)
    served = served_form(weight)
    assert isinstance(served, Int4Weight)
    assert served.has_zeros == (quant_kernels() is None)
    q4_1, _ = _blocks("Q4_1", 64, 512, torch.bfloat16)
    assert as_int4_tiles(q4_1).has_zeros
