"""int8: per-output-channel symmetric weights, W[n, k] = q[n, k] * scale[n], q in [-127, 127].

The layout is torch's own (`_weight_int8pack_mm` takes q [out, in] int8 and scales [out] in the
activations' dtype), so torch's kernel and the C one (csrc/quant_linear.c) read the same tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from tgictl.kernels.linear import amx_available, native_replaces_packed_copy
from tgictl.kernels.linear_methods.base import LinearFn, LinearWeight, with_common
from tgictl.kernels.linear_methods.native import quant_kernels


def smallest_scale(dtype: torch.dtype) -> float:
    """The smallest normal number of `dtype`: an all-zero row keeps a usable (non-zero) scale."""
    return float(torch.finfo(dtype).tiny)


class Int8Weight(LinearWeight):
    method = "int8"

    def __init__(self, qweight: Tensor, scales: Tensor) -> None:
        super().__init__(qweight.shape[0], qweight.shape[1], scales.dtype)
        self.register_buffer("qweight", qweight)  # [out, in] int8
        self.register_buffer("scales", scales)  # [out] in the serving dtype

    @classmethod
    def quantize(cls, weight: Tensor, dtype: torch.dtype) -> Int8Weight:
        """weight [out, in] (any float dtype) -> its int8 form with scales in `dtype`.

        The scale is rounded to `dtype` first and q computed with the rounded scale, so q * scale is the
        closest the stored form can come to each weight.
        """
        w = weight.float()
        scales = (w.abs().amax(dim=1) / 127).to(dtype).clamp_min(smallest_scale(dtype))  # [out]
        q = torch.round(w / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
        return cls(q.contiguous(), scales.contiguous())

    def dequantize(self) -> Tensor:
        return self.qweight.float() * self.scales.float()[:, None]

    def dequantize_rows(self, rows: Tensor) -> Tensor:
        return self.qweight.index_select(0, rows).float() * self.scales.index_select(0, rows).float()[:, None]

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + self.scales.numel() * self.scales.element_size()

    def backends(self) -> Mapping[str, LinearFn]:
        return INT8_BACKENDS

    def wants_packed_copy(self, policy: str) -> bool:
        """Under `auto`, no bf16 copy (of the int8 vocabulary, the only int8 weight that asks) where the AMX or
        VDPBF16PS kernel decodes the rows itself: it is as fast as oneDNN on the copy (see kernels/linear.py)."""
        return not (native_replaces_packed_copy(policy) and self.scales.dtype == torch.bfloat16)

    @classmethod
    def concat_rows(cls, parts: Sequence[LinearWeight]) -> LinearWeight | None:
        typed = [p for p in parts if isinstance(p, Int8Weight)]
        if len({p.scales.dtype for p in typed}) != 1:
            return None
        return cls(torch.cat([p.qweight for p in typed]), torch.cat([p.scales for p in typed]))


def _torch_int8(weight: LinearWeight, x: Tensor, bias: Tensor | None) -> Tensor | None:
    """torch's CPU kernel; it wants the scales in x's dtype, and input widths in multiples of 16 (torch 2.13's
    kernel reads them 16 at a time: at 8, 24 or 100 it crashed the process)."""
    assert isinstance(weight, Int8Weight)
    if x.device.type != "cpu" or x.dtype != weight.scales.dtype or x.dim() != 2 or x.shape[1] % 16 != 0:
        return None
    out = torch.ops.aten._weight_int8pack_mm(x.contiguous(), weight.qweight, weight.scales)
    return out if bias is None else out + bias


def _native_int8(weight: LinearWeight, x: Tensor, bias: Tensor | None) -> Tensor | None:
    assert isinstance(weight, Int8Weight)
    kernels = quant_kernels()
    return None if kernels is None else kernels.int8_linear(x, weight.qweight, weight.scales, bias)


def _native_int8_bf16(weight: LinearWeight, x: Tensor, bias: Tensor | None) -> Tensor | None:
    assert isinstance(weight, Int8Weight)
    kernels = quant_kernels()
    return None if kernels is None else kernels.int8_bf16_linear(x, weight.qweight, weight.scales, bias)


# Prefill-sized products on CPUs without AMX: oneDNN's bf16 GEMM on strips of rows decoded to bf16 beats the C
# kernel's VDPBF16PS loop once the decode is paid back (AMD EPYC Zen 4, 2 threads, Llama-3.2-1B's four shapes:
# 1.12-1.33x at 256 and 1024 rows, slower at 64). AMX machines keep the C kernel's AMX tiles (not measured there).
ONEDNN_STRIPS_MIN_ROWS = 256
ONEDNN_STRIP_ROWS = 1024  # output rows decoded at a time: 2-16 MiB of bf16 for 1-8k inputs, reused across strips


def _onednn_strips(weight: LinearWeight, x: Tensor, bias: Tensor | None) -> Tensor | None:
    assert isinstance(weight, Int8Weight)
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or weight.scales.dtype != torch.bfloat16 \
            or x.dim() != 2 or x.shape[0] < ONEDNN_STRIPS_MIN_ROWS or amx_available():
        return None
    n = weight.out_features
    out = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
    strip = torch.empty(min(n, ONEDNN_STRIP_ROWS), weight.in_features, dtype=torch.bfloat16)
    bias16 = None if bias is None else bias.to(torch.bfloat16)
    for start in range(0, n, ONEDNN_STRIP_ROWS):
        stop = min(start + ONEDNN_STRIP_ROWS, n)
        rows = strip[: stop - start]
        rows.copy_(weight.qweight[start:stop]).mul_(weight.scales[start:stop, None])  # bf16(q * scale), exact q
        out[:, start:stop] = torch.nn.functional.linear(x, rows, None if bias16 is None else bias16[start:stop])
    return out


INT8_BACKENDS: Mapping[str, LinearFn] = with_common(
    {"torch": _torch_int8, "native": _native_int8, "native_bf16": _native_int8_bf16, "onednn_strips": _onednn_strips})
