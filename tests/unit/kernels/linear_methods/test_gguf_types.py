"""GGUF block types: the pure-torch dequantization equals the gguf package's own dequantizer bit for bit, and
the C kernel's decoder gives the same values; blocks slice and concatenate as bytes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tgictl.kernels.linear_methods import BLOCK_TYPES, GGUFWeight
from tgictl.kernels.linear_methods.native import quant_kernels
from tgictl.testing.gguf_blocks import quantized_blocks

TYPES = sorted(BLOCK_TYPES)


def _blocks(type_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((rows, cols)).astype(np.float32)
    weights[0] = 0.0  # an all-zero row: d = 0 blocks
    weights[1, : cols // 2] *= 1e-3  # tiny values next to ordinary ones
    return quantized_blocks(type_name, weights, rng)


def _bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantize_equals_gguf_bit_for_bit(type_name: str) -> None:
    block_type = BLOCK_TYPES[type_name]
    data = _blocks(type_name, 7, 2 * 256)
    expected = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[type_name])
    ours = block_type.dequantize(torch.from_numpy(data))
    assert ours.dtype == torch.float32 and ours.shape == expected.shape
    assert np.array_equal(_bits(ours.numpy()), _bits(expected))
    assert block_type.ggml_type == int(gguf.GGMLQuantizationType[type_name])
    assert (block_type.block_size, block_type.type_size) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]


@pytest.mark.parametrize("type_name", TYPES)
def test_c_decoder_gives_the_reference_values(type_name: str) -> None:
    kernels = quant_kernels()
    assert kernels is not None
    block_type = BLOCK_TYPES[type_name]
    data = torch.from_numpy(_blocks(type_name, 9, 512, seed=1))
    decoded = kernels.gguf_dequantize(data, block_type.native_id, 512)
    assert decoded is not None
    assert torch.equal(decoded, block_type.dequantize(data))  # the same operations, rounded one by one


@pytest.mark.parametrize("type_name", TYPES)
def test_rows_and_block_aligned_columns_slice_exactly(type_name: str) -> None:
    block_type = BLOCK_TYPES[type_name]
    size = block_type.block_size
    weight = GGUFWeight(torch.from_numpy(_blocks(type_name, 6, 4 * size, seed=2)), block_type, 4 * size, torch.float32)
    full = weight.dequantize()
    assert torch.equal(weight.slice_rows(2, 5).dequantize(), full[2:5])
    part = weight.slice_columns(size, 3 * size)
    assert part is not None and part.in_features == 2 * size
    assert torch.equal(part.dequantize(), full[:, size : 3 * size])
    assert weight.slice_columns(1, 2 * size) is None  # inside a block: not expressible as blocks
    rows = torch.tensor([5, 0, 3])
    assert torch.equal(weight.dequantize_rows(rows), full[rows])
    assert weight.nbytes == 6 * 4 * block_type.type_size


def test_concatenation_is_per_block_type() -> None:
    from tgictl.kernels.linear_methods import StackedLinearWeight, concat_rows

    q4 = GGUFWeight(torch.from_numpy(_blocks("Q4_0", 4, 256)), BLOCK_TYPES["Q4_0"], 256, torch.float32)
    q8 = GGUFWeight(torch.from_numpy(_blocks("Q8_0", 3, 256)), BLOCK_TYPES["Q8_0"], 256, torch.float32)
    fused = concat_rows([q4, q4.slice_rows(0, 2)])
    assert isinstance(fused, GGUFWeight) and fused.out_features == 6
    mixed = concat_rows([q4, q8])
    assert isinstance(mixed, StackedLinearWeight) and mixed.shape == (7, 256)
    x = torch.randn(2, 256)
    torch.testing.assert_close(mixed(x), torch.cat([q4(x), q8(x)], dim=-1), rtol=0, atol=0)
    assert torch.equal(mixed.dequantize(), torch.cat([q4.dequantize(), q8.dequantize()]))


def test_malformed_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="Q4_0 rows of 64 weights need 36 bytes, not 35"):
        GGUFWeight(torch.zeros(2, 35, dtype=torch.uint8), BLOCK_TYPES["Q4_0"], 64, torch.float32)
