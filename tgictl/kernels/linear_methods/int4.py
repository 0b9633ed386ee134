"""int4: group-wise asymmetric weights, W[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n], g = k // G,
q in 0..15 (the convention of torch's int4 kernels: zero = the low end of the group's range + 8 * scale;
the range is the group's [min, max], or that shrunk where clipping its outliers reconstructs it better).

Storage, shared by torch's kernel and the C one (csrc/quant_linear.c), in tiles of 64 output rows:
    packed       [N_pad / 64, K_pad, 32] uint8: byte j of (tile t, column k) holds row t*64 + j in its low
                 nibble and row t*64 + 32 + j in its high nibble
    scales_zeros [K_pad / G, N_pad, 2] in the serving dtype: (scale, zero) per group and row, or
                 [K_pad / G, N_pad, 1], the scale alone, for a symmetric format whose zero is 0 (GGUF's Q4_0:
                 w = d (q - 8)): a one-row step then reads 18 bytes per 32 weights, the file's own size, not 20
N_pad and K_pad round the shape up to 64 rows and to the group size with zero weights, so any shape
quantizes; the padding is never returned. This is the layout `_convert_weight_to_int4pack_for_cpu`
produces on AVX-512 CPUs for N a multiple of 64: torch's kernel is used only once a probe has shown that
this build packs exactly so (`torch_layout_matches`), and only with stored zeros (it reads pairs); elsewhere
the C kernels (told the form by `sz_form`, csrc/int4_scales.h) and the reference remain.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from tgictl.kernels.linear_methods.base import LinearFn, LinearWeight, with_common
from tgictl.kernels.linear_methods.int8 import smallest_scale
from tgictl.kernels.linear_methods.native import quant_kernels

TILE_ROWS = 64
HALF_TILE = TILE_ROWS // 2
# How far a group's [min, max] may shrink about its middle when its levels are chosen (besides not at all).
CLIP_SHRINKS: tuple[float, ...] = (0.95, 0.9, 0.85, 0.8, 0.75)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _levels(groups: Tensor, low: Tensor, high: Tensor,
            dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The 16 levels spanning [low, high] per group: scale and zero in `dtype`, q (float, 0..15) per
    weight, and the group's squared reconstruction error."""
    scale = ((high - low) / 15).to(dtype).clamp_min(smallest_scale(dtype))
    zero = (low + 8 * scale.float()).to(dtype)
    q = torch.round((groups - zero.float()[..., None]) / scale.float()[..., None] + 8).clamp_(0, 15)
    error = ((q - 8) * scale.float()[..., None] + zero.float()[..., None] - groups).square().sum(dim=-1)
    return scale, zero, q, error


def pack_tiles(q: Tensor) -> Tensor:
    """q [N_pad, K_pad] uint8 in 0..15 (N_pad a multiple of 64) -> packed [N_pad / 64, K_pad, 32] uint8."""
    n_pad, k_pad = q.shape
    tiles = q.view(n_pad // TILE_ROWS, TILE_ROWS, k_pad)
    packed = tiles[:, :HALF_TILE] | (tiles[:, HALF_TILE:] << 4)  # [T, 32, K_pad]
    return packed.transpose(1, 2).contiguous()


def unpack_tiles(packed: Tensor) -> Tensor:
    """packed [T, K_pad, 32] uint8 -> q [T * 64, K_pad] uint8."""
    tiles, k_pad, _ = packed.shape
    q = torch.cat([packed & 15, packed >> 4], dim=2)  # [T, K_pad, 64]: rows j, then rows 32 + j
    return q.transpose(1, 2).reshape(tiles * TILE_ROWS, k_pad)


class Int4Weight(LinearWeight):
    method = "int4"

    def __init__(self, packed: Tensor, scales_zeros: Tensor, *, out_features: int, in_features: int,
                 group_size: int) -> None:
        super().__init__(out_features, in_features, scales_zeros.dtype)
        self.group_size = group_size
        self.register_buffer("packed", packed)  # [N_pad / 64, K_pad, 32] uint8
        self.register_buffer("scales_zeros", scales_zeros)  # [K_pad / G, N_pad, 2], or [.., 1]: scales alone

    @property
    def has_zeros(self) -> bool:
        """Whether a zero is stored beside each scale (False: a symmetric format, the zero is 0)."""
        return self.scales_zeros.shape[-1] == 2

    @property
    def format_key(self) -> str:
        return f"int4/g{self.group_size}"

    @property
    def padded_in_features(self) -> int:
        return self.packed.shape[1]

    @classmethod
    def quantize(cls, weight: Tensor, group_size: int, dtype: torch.dtype) -> Int4Weight:
        """weight [out, in] (any float dtype) -> its int4 form, scales and zeros in `dtype`.

        Each group takes the range, among its [min, max] shrunk about the middle by CLIP_SHRINKS, whose
        16 levels reconstruct it with the least squared error: one outlier stretches the min-max range
        and leaves the rest of the group few levels (with groups of 64 on the default model this took
        perplexity from +36% to +32% over bf16; a group that already lies on 16 levels stays exact).
        Scale and zero are rounded to `dtype` first and q computed with the rounded values, so the stored
        form reconstructs each weight as closely as it can.
        """
        n, k = weight.shape
        n_pad, k_pad = _round_up(n, TILE_ROWS), _round_up(k, group_size)
        w = F.pad(weight.float(), (0, k_pad - k, 0, n_pad - n))  # padding: zero weights
        groups = w.view(n_pad, k_pad // group_size, group_size)
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # [N_pad, groups]
        middle, half_range = (low + high) / 2, (high - low) / 2
        scale, zero, q, error = _levels(groups, low, high, dtype)  # min-max
        for shrink in CLIP_SHRINKS:
            s_scale, s_zero, s_q, s_error = _levels(groups, middle - shrink * half_range,
                                                    middle + shrink * half_range, dtype)
            better = s_error < error
            scale = torch.where(better, s_scale, scale)
            zero = torch.where(better, s_zero, zero)
            error = torch.where(better, s_error, error)
            q = torch.where(better[..., None], s_q, q)
        return cls.from_groups(q.to(torch.uint8).view(n_pad, k_pad), scale, zero, group_size, n, k)

    @classmethod
    def from_groups(cls, q: Tensor, scale: Tensor, zero: Tensor | None, group_size: int, out_features: int,
                    in_features: int) -> Int4Weight:
        """The stored form of W = (q - 8) * scale + zero: q [N_pad, K_pad] uint8 in 0..15, scale and zero
        [N_pad, K_pad / group_size] in the serving dtype, already padded (64 rows, the group size); zero None
        for a symmetric format (W = (q - 8) * scale), whose scales are then stored alone."""
        parts = [scale] if zero is None else [scale, zero]
        scales_zeros = torch.stack(parts, dim=-1).transpose(0, 1).contiguous()  # [groups, N_pad, 1 or 2]
        return cls(pack_tiles(q), scales_zeros, out_features=out_features, in_features=in_features,
                   group_size=group_size)

    def _expanded(self, part: int) -> Tensor:
        """scale (part 0) or zero (part 1, 0 where none is stored) per weight: [N_pad, K_pad] float32."""
        if part == 1 and not self.has_zeros:
            groups, n_pad, _ = self.scales_zeros.shape
            return torch.zeros(n_pad, groups * self.group_size)
        return self.scales_zeros[..., part].float().t().repeat_interleave(self.group_size, dim=1)

    def dequantize(self) -> Tensor:
        q = unpack_tiles(self.packed).float()
        w = (q - 8) * self._expanded(0) + self._expanded(1)
        return w[: self.out_features, : self.in_features].contiguous()

    def dequantize_rows(self, rows: Tensor) -> Tensor:
        k_pad = self.padded_in_features
        columns = torch.arange(k_pad, device=rows.device)
        byte = self.packed[(rows // TILE_ROWS)[:, None], columns[None, :], (rows % HALF_TILE)[:, None]]  # [n, K_pad]
        shift = torch.where(rows % TILE_ROWS >= HALF_TILE, 4, 0).to(torch.uint8)
        q = ((byte >> shift[:, None]) & 15).float()
        sz = self.scales_zeros[:, rows].float().repeat_interleave(self.group_size, dim=0)  # [K_pad, n, 1 or 2]
        w = (q - 8) * sz[..., 0].t() + (sz[..., 1].t() if self.has_zeros else 0.0)
        return w[:, : self.in_features].contiguous()

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales_zeros.numel() * self.scales_zeros.element_size()

    def backends(self) -> Mapping[str, LinearFn]:
        return INT4_BACKENDS


@functools.cache
def torch_layout_matches() -> bool:
    """Whether this torch build packs int4 weights exactly as `pack_tiles` does (a 128 x 64 probe)."""
    q = torch.randint(0, 16, (2 * TILE_ROWS, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    try:
        theirs = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
    except (RuntimeError, AttributeError):
        return False
    ours = pack_tiles(q.to(torch.uint8))
    return theirs.dtype == torch.uint8 and theirs.numel() == ours.numel() and torch.equal(theirs.reshape(-1), ours.reshape(-1))


def _torch_int4(weight: LinearWeight, x: Tensor, bias: Tensor | None) -> Tensor | None:
    """torch's CPU kernel: it wants x padded to K_pad and scales in x's dtype; returns N_pad columns."""
    assert isinstance(weight, Int4Weight)
    if x.device.type != "cpu" or x.dtype != weight.scales_zeros.dtype or x.dim() != 2 or not weight.has_zeros \
            or not torch_layout_matches():
        return None
    k_pad = weight.padded_in_features
    if k_pad != weight.in_features:
        x = F.pad(x, (0, k_pad - weight.in_features))
    n_pad = weight.packed.shape[0] * TILE_ROWS
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.contiguous(), weight.packed.view(n_pad, k_pad // 2), weight.group_size, weight.scales_zeros
    )[:, : weight.out_features]
    return out if bias is None else out + bias


def _native_int4(weight: LinearWeight, x: Tensor, bias: Tensor | None) -> Tensor | None:
    assert isinstance(weight, Int4Weight)
    kernels = quant_kernels()
    if kernels is None:
        return None
    return kernels.int4_linear(x, weight.packed, weight.scales_zeros, weight.group_size, weight.out_features, bias)


def _native_int4_bf16(weight: LinearWeight, x: Tensor, bias: Tensor | None) -> Tensor | None:
    assert isinstance(weight, Int4Weight)
    kernels = quant_kernels()
    if kernels is None:
        return None
    return kernels.int4_bf16_linear(x, weight.packed, weight.scales_zeros, weight.group_size, weight.out_features,
                                    bias)


INT4_BACKENDS: Mapping[str, LinearFn] = with_common(
    {"torch": _torch_int4, "native": _native_int4, "native_bf16": _native_int4_bf16})
