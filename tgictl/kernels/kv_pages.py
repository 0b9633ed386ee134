"""The paged KV cache's storage formats (`--kv-cache-dtype`, tgictl/kv_cache_dtype.py; docs/kv-cache.md): how one
layer's K or V is held, written by slot and read back. These torch functions are the reference every compiled
path (the rotary + store kernel, decode and prefill attention) is tested against.

- The model's dtype or fp8: a plain tensor [num_blocks, block_size, kv_heads, head_dim] (fp8 written through a
  uint8 view: torch's CPU index_copy_ has no float8 kernels).
- int8: `Int8Pages`, values int8 [num_blocks, block_size, kv_heads, head_dim] and one bf16 scale per slot and
  head [num_blocks, block_size, kv_heads]; a row x (one token, one head) is stored as
      s = bf16(amax|x| / 127)   (round to nearest even)
      q = clamp(rint(x / s), -127, 127)   (float32 division, ties to even; q = 0 where s == 0)
  and read back as q * s. Rows are quantized on their own, so a token's K/V never depends on its batch or on the
  tokens beside it, and a cached prefix reads the same whoever wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tgictl.kv_cache_dtype import check_kv_cache_dtype

INT8_MAX = 127
# fp8 has no infinity in e4m3fn (a cast saturates) but e5m2 overflows to inf: values are clamped to its range.
FP8_DTYPES = {"fp8_e4m3fn": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@dataclass(frozen=True, eq=False)
class Int8Pages:
    """One layer's K or V in int8 with a bf16 scale per slot and KV head (the module docstring's format)."""

    values: Tensor  # [num_blocks, block_size, kv_heads, head_dim] int8
    scales: Tensor  # [num_blocks, block_size, kv_heads] bfloat16

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def dim(self) -> int:
        return self.values.dim()

    def is_contiguous(self) -> bool:
        return self.values.is_contiguous() and self.scales.is_contiguous()

    @property
    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size() + self.scales.numel() * self.scales.element_size()


Pages = Tensor | Int8Pages  # what one layer's K or V cache is


def allocate_pages(kv_cache_dtype: str, shape: tuple[int, int, int, int], model_dtype: torch.dtype,
                   device: torch.device) -> Pages:
    """A zero-filled cache of `shape` [num_blocks, block_size, kv_heads, head_dim] in the format."""
    check_kv_cache_dtype(kv_cache_dtype)
    if kv_cache_dtype == "int8":
        return Int8Pages(torch.zeros(shape, dtype=torch.int8, device=device),
                         torch.zeros(shape[:3], dtype=torch.bfloat16, device=device))
    dtype = FP8_DTYPES.get(kv_cache_dtype, model_dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


def pages_nbytes(pages: Pages) -> int:
    return pages.nbytes if isinstance(pages, Int8Pages) else pages.numel() * pages.element_size()


def quantize_int8(rows: Tensor) -> tuple[Tensor, Tensor]:
    """(values int8, scales bf16) of rows [..., head_dim]: one scale per row (the module docstring's rule)."""
    x = rows.float()
    scale = (x.abs().amax(dim=-1) / INT8_MAX).to(torch.bfloat16)
    divisor = scale.float().unsqueeze(-1)
    q = torch.where(divisor > 0, x / divisor.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    return torch.round(q).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def dequantize_int8(values: Tensor, scales: Tensor, dtype: torch.dtype) -> Tensor:
    """values [..., head_dim] * scales [...] in float32, rounded once to `dtype`."""
    return (values.float() * scales.float().unsqueeze(-1)).to(dtype)


def _flat(cache: Tensor) -> Tensor:
    # [num_blocks, block_size, kv_heads, head_dim] -> [num_slots, kv_heads, head_dim] (a view)
    return cache.view(-1, cache.shape[2], cache.shape[3])


def store_rows(rows: Tensor, pages: Pages, slots: Tensor) -> None:
    """Write rows [tokens, kv_heads, head_dim] (the model's dtype) at flat slots [tokens], in place."""
    if isinstance(pages, Int8Pages):
        values, scales = quantize_int8(rows)
        _flat(pages.values).index_copy_(0, slots, values)
        pages.scales.view(-1, pages.scales.shape[2]).index_copy_(0, slots, scales)
        return
    if pages.dtype in FP8_DTYPES.values():
        limit = torch.finfo(pages.dtype).max
        encoded = rows.float().clamp(-limit, limit).to(pages.dtype).view(torch.uint8)
        _flat(pages.view(torch.uint8)).index_copy_(0, slots, encoded)
        return
    # The cache may hold a narrower dtype than the activations; the cast happens here, once.
    _flat(pages).index_copy_(0, slots, rows.to(pages.dtype))


def gather_rows(pages: Pages, slots: Tensor, dtype: torch.dtype) -> Tensor:
    """The rows at flat slots [n] as [n, kv_heads, head_dim] in `dtype` (int8: dequantized, one rounding)."""
    if isinstance(pages, Int8Pages):
        values = _flat(pages.values).index_select(0, slots)
        scales = pages.scales.view(-1, pages.scales.shape[2]).index_select(0, slots)
        return dequantize_int8(values, scales, dtype)
    if pages.dtype in FP8_DTYPES.values():
        return _flat(pages.view(torch.uint8)).index_select(0, slots).view(pages.dtype).to(dtype)
    return _flat(pages).index_select(0, slots).to(dtype)

