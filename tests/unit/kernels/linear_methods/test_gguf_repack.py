"""GGUF Q4_0 / Q4_1 blocks as int4 tiles: the same weights as the file's (the `gguf` package's
dequantizer) in float32, within the bf16 rounding of the scales in bf16; other block types stay blocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tgictl.kernels.linear_methods import BLOCK_TYPES, GGUFWeight, Int4Weight
from tgictl.kernels.linear_methods.gguf_repack import as_int4_tiles, served_form
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
    n_pad = -(-rows // 64) * 64  # half a byte per weight, a float32 scale and zero per 32, rows padded to 64
    assert tiles.nbytes == n_pad * cols // 2 + n_pad * cols // 32 * 2 * 4


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
def test_bfloat16_scales_round_once(type_name: str) -> None:
    weight, _ = _blocks(type_name, 128, 576, torch.bfloat16)
    tiles = as_int4_tiles(weight)
    assert tiles.nbytes == 128 * 576 // 32 * 20  # bf16 scales: 20 bytes per 32 weights, as Q4_1's blocks
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
