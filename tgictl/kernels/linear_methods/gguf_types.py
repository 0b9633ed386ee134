"""GGUF block types served natively: their layout and their dequantization in pure torch.

Every function reproduces the `gguf` package's numpy dequantizer (gguf/quants.py, itself llama.cpp's
ggml-quants.c) operation for operation in float32, so the values are equal bit for bit
(tests/unit/kernels/linear_methods/test_gguf_types.py checks each type against `gguf.quants.dequantize`).
A row of a [out, in] matrix is in / block_size consecutive blocks of type_size bytes, so rows can be
sliced, gathered and concatenated as bytes; columns only on block boundaries.

Block layouts (d, dmin, m: float16; ggml's names):
    Q4_0  32 weights, 18 bytes: d, 16 bytes of nibbles (low: weights 0-15, high: 16-31); w = d * (q - 8)
    Q4_1  32 weights, 20 bytes: d, m, 16 bytes of nibbles; w = d * q + m
    Q8_0  32 weights, 34 bytes: d, 32 int8; w = d * q
    Q4_K  256 weights, 144 bytes: d, dmin, 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes of
          nibbles (bytes 32i..32i+31: low nibbles sub-block 2i, high 2i+1); w = d * sc * q - dmin * m
    Q6_K  256 weights, 210 bytes: 128 bytes low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, d;
          w = d * scale * (q - 32) over sub-blocks of 16
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

QK_K = 256


def block_f16(blocks: Tensor, start: int) -> Tensor:
    """The float16 at byte `start` of every block, as float32 [blocks, 1]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def block_nibbles(qs: Tensor, width: int) -> Tensor:
    """qs [blocks, chunks * width] uint8 -> [blocks, chunks * 2 * width]: per chunk its low nibbles, then its
    high nibbles (ggml's order within a block)."""
    blocks = qs.shape[0]
    chunks = qs.view(blocks, -1, 1, width)
    return torch.cat([chunks & 0x0F, chunks >> 4], dim=2).view(blocks, -1)


def dequantize_q4_0(blocks: Tensor) -> Tensor:
    d = block_f16(blocks, 0)
    q = (block_nibbles(blocks[:, 2:], 16).view(torch.int8) - 8).float()
    return d * q


def dequantize_q4_1(blocks: Tensor) -> Tensor:
    d, m = block_f16(blocks, 0), block_f16(blocks, 2)
    q = block_nibbles(blocks[:, 4:], 16).float()
    return (d * q) + m


def dequantize_q8_0(blocks: Tensor) -> Tensor:
    d = block_f16(blocks, 0)
    return blocks[:, 2:].contiguous().view(torch.int8).float() * d


def q4_k_scales(scales: Tensor) -> tuple[Tensor, Tensor]:
    """The eight 6-bit (scale, min) pairs of Q4_K's 12 scale bytes: ([blocks, 8], [blocks, 8]) uint8."""
    blocks = scales.shape[0]
    s = scales.reshape(blocks, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mins


def dequantize_q4_k(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    d, dmin = block_f16(blocks, 0), block_f16(blocks, 2)
    sc, mins = q4_k_scales(blocks[:, 4:16])
    scale = (d * sc.float()).view(n, 8, 1)
    offset = (dmin * mins.float()).view(n, 8, 1)
    q = block_nibbles(blocks[:, 16:], 32).view(n, 8, 32).float()
    return (scale * q - offset).view(n, QK_K)


def dequantize_q6_k(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
    d = block_f16(blocks, 208)
    scale = (d * scales).view(n, 16, 1)
    low = block_nibbles(ql, 64).view(n, 8, 32)  # [halves * (low, high) * 2 chunks of 32]
    high = qh.reshape(n, 2, 1, 32)
    high = torch.cat([(high >> shift) & 0x03 for shift in (0, 2, 4, 6)], dim=2).view(n, 8, 32)
    q = ((low | (high << 4)).view(torch.int8) - 32).view(n, 16, 16).float()
    return (scale * q).view(n, QK_K)


@dataclass(frozen=True)
class BlockType:
    """One GGUF block type: `block_size` weights in `type_size` bytes."""

    name: str
    ggml_type: int  # gguf.GGMLQuantizationType value
    block_size: int
    type_size: int
    dequantize_blocks: Callable[[Tensor], Tensor]  # [blocks, type_size] uint8 -> [blocks, block_size] float32
    native_id: int  # the type's number in csrc/gguf_linear.c

    def bits_per_weight(self) -> float:
        return 8 * self.type_size / self.block_size

    def dequantize(self, data: Tensor) -> Tensor:
        """data [rows, row_bytes] uint8 -> [rows, row_bytes / type_size * block_size] float32."""
        rows = data.shape[0]
        blocks = data.reshape(-1, self.type_size)
        return self.dequantize_blocks(blocks).view(rows, -1)


# ggml_type values from ggml.h (gguf.GGMLQuantizationType): Q4_0 2, Q4_1 3, Q8_0 8, Q4_K 12, Q6_K 14.
BLOCK_TYPES: Mapping[str, BlockType] = MappingProxyType({
    t.name: t
    for t in (
        BlockType("Q4_0", 2, 32, 18, dequantize_q4_0, 0),
        BlockType("Q4_1", 3, 32, 20, dequantize_q4_1, 1),
        BlockType("Q8_0", 8, 32, 34, dequantize_q8_0, 2),
        BlockType("Q4_K", 12, QK_K, 144, dequantize_q4_k, 3),
        BlockType("Q6_K", 14, QK_K, 210, dequantize_q6_k, 4),
    )
})
BLOCK_TYPES_BY_GGML: Mapping[int, BlockType] = MappingProxyType({t.ggml_type: t for t in BLOCK_TYPES.values()})
