"""The quantized linears' C kernels (csrc/quant_linear.c, csrc/int4_bf16.c, csrc/gguf_linear.c), bound from the library that
kernels/native.py builds once per machine. None where that library is unavailable: the formats then
keep torch's kernels and their pure-torch reference."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tgictl.kernels.native import bf16_product, load_native_kernels

CFunction = ctypes._CFuncPtr  # type: ignore[name-defined]
_SCALE_DTYPES = (torch.float32, torch.bfloat16)


def _ptr(tensor: Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _usable(x: Tensor, *stored: Tensor) -> bool:
    return x.dim() == 2 and x.device.type == "cpu" and all(t.device.type == "cpu" and t.is_contiguous() for t in stored)


def int4_sz_form(scales_zeros: Tensor) -> int:
    """How int4 tiles' scales are stored, as csrc/int4_scales.h's flags: SZ_BF16 (1) for bf16 values, SZ_ZERO (2)
    for [groups, N_pad, 2] (scale, zero) pairs; [groups, N_pad, 1] holds the scales of a symmetric format alone."""
    return int(scales_zeros.dtype == torch.bfloat16) | (2 if scales_zeros.shape[-1] == 2 else 0)


def _inputs(x: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """x and bias as the kernels read them: contiguous float32 (a few rows, converted once)."""
    return x.float().contiguous(), None if bias is None else bias.float().contiguous()


@dataclass(frozen=True)
class QuantKernels:
    int8: CFunction
    int8_bf16: CFunction
    int4: CFunction
    int4_rows_bf16: CFunction
    int4_rows_bf16_available: CFunction
    int4_bf16: CFunction
    int4_bf16_path: CFunction
    gguf: CFunction
    gguf_decode: CFunction
    gguf_bf16: CFunction
    q6_k_rows_bf16_available: CFunction

    def int8_linear(self, x: Tensor, qweight: Tensor, scales: Tensor, bias: Tensor | None) -> Tensor | None:
        """x [m, k] @ (qweight [n, k] int8 * scales [n])^T + bias -> [m, n] in x's dtype."""
        if not _usable(x, qweight, scales) or scales.dtype not in _SCALE_DTYPES:
            return None
        x32, b32 = _inputs(x, bias)
        m, k = x32.shape
        n = qweight.shape[0]
        y = torch.empty(m, n, dtype=torch.float32)
        self.int8(x32.data_ptr(), qweight.data_ptr(), scales.data_ptr(), int(scales.dtype == torch.bfloat16),
                  _ptr(b32), y.data_ptr(), m, n, k, torch.get_num_threads())
        return y.to(x.dtype)

    def int8_bf16_linear(self, x: Tensor, qweight: Tensor, scales: Tensor, bias: Tensor | None) -> Tensor | None:
        """Many bf16 rows x [m, k] against int8 rows with bf16 scales, each strip of 32 rows decoded to bf16 and
        multiplied with AMX -> [m, n] bf16; None without AMX or for another input."""
        if not _usable(x, qweight, scales) or x.dtype != torch.bfloat16 or scales.dtype != torch.bfloat16:
            return None
        n, k = qweight.shape[0], x.shape[1]
        return bf16_product(x, n, bias, lambda x_ptr, bias_ptr, y_ptr, m: self.int8_bf16(
            x_ptr, qweight.data_ptr(), scales.data_ptr(), bias_ptr, y_ptr, m, n, k, torch.get_num_threads()))

    def int4_linear(self, x: Tensor, packed: Tensor, scales_zeros: Tensor, group_size: int, out_features: int,
                    bias: Tensor | None) -> Tensor | None:
        """x [m, k] against int4 tiles (linear_methods/int4.py; scales with or without zeros) -> [m, out_features]
        in x's dtype. 1-4 bf16 rows with bf16 scales take VDPBF16PS where the CPU has it (csrc/int4_rows_bf16.c),
        others float32."""
        if not _usable(x, packed, scales_zeros) or scales_zeros.dtype not in _SCALE_DTYPES:
            return None
        sz_form = int4_sz_form(scales_zeros)
        if self.rows_bf16_built and x.dtype == torch.bfloat16 and scales_zeros.dtype == torch.bfloat16 \
                and x.shape[0] <= 4:
            x16 = x.contiguous()
            b32 = None if bias is None else bias.float().contiguous()
            m, k = x16.shape
            y = torch.empty(m, out_features, dtype=torch.float32)
            if self.int4_rows_bf16(x16.data_ptr(), packed.data_ptr(), scales_zeros.data_ptr(), sz_form, group_size,
                                   _ptr(b32), y.data_ptr(), m, out_features, k, packed.shape[1],
                                   torch.get_num_threads()) == 0:
                return y.to(torch.bfloat16)
        x32, b32 = _inputs(x, bias)
        m, k = x32.shape
        y = torch.empty(m, out_features, dtype=torch.float32)
        status = self.int4(x32.data_ptr(), packed.data_ptr(), scales_zeros.data_ptr(), sz_form, group_size,
                           _ptr(b32), y.data_ptr(), m, out_features, k, packed.shape[1], torch.get_num_threads())
        return y.to(x.dtype) if status == 0 else None

    def int4_bf16_linear(self, x: Tensor, packed: Tensor, scales_zeros: Tensor, group_size: int, out_features: int,
                         bias: Tensor | None) -> Tensor | None:
        """Many bf16 rows x [m, k] against int4 tiles with bf16 scales, on a bf16 copy of each tile (AMX or
        AVX512-BF16) -> [m, out_features] bf16; None where this CPU, build or input does not allow it."""
        if not _usable(x, packed, scales_zeros) or x.dtype != torch.bfloat16 or scales_zeros.dtype != torch.bfloat16:
            return None
        k_pad, sz_form = packed.shape[1], int4_sz_form(scales_zeros)
        x = F.pad(x, (0, k_pad - x.shape[1])) if k_pad != x.shape[1] else x
        return bf16_product(x, out_features, bias, lambda x_ptr, bias_ptr, y_ptr, m: self.int4_bf16(
            x_ptr, packed.data_ptr(), scales_zeros.data_ptr(), sz_form, group_size, bias_ptr, y_ptr, m, out_features,
            k_pad, torch.get_num_threads()))

    @functools.cached_property
    def rows_bf16_built(self) -> bool:
        """Whether this build has csrc/int4_rows_bf16.c's kernel (asked once: int4_linear is on the hot path)."""
        return bool(self.int4_rows_bf16_available())

    @functools.cached_property
    def q6_k_rows_built(self) -> bool:
        """Whether this build has csrc/gguf_q6_k_rows.c's kernel (Q6_K at 1-4 bf16 rows, AVX512-BF16)."""
        return bool(self.q6_k_rows_bf16_available())

    @property
    def int4_bf16_instructions(self) -> str:
        """What int4_bf16_linear multiplies with on this CPU and build: "amx", "avx512-bf16" or "none"."""
        return {2: "amx", 1: "avx512-bf16"}.get(self.int4_bf16_path(), "none")

    def gguf_linear(self, x: Tensor, data: Tensor, native_id: int, in_features: int,
                    bias: Tensor | None) -> Tensor | None:
        """x [m, k] against GGUF blocks data [n, row_bytes] of block type `native_id` -> [m, n] in x's dtype."""
        if not _usable(x, data):
            return None
        x32, b32 = _inputs(x, bias)
        m = x32.shape[0]
        n, row_bytes = data.shape
        y = torch.empty(m, n, dtype=torch.float32)
        status = self.gguf(native_id, x32.data_ptr(), data.data_ptr(), row_bytes, _ptr(b32), y.data_ptr(), m, n,
                           in_features, torch.get_num_threads())
        return y.to(x.dtype) if status == 0 else None

    def gguf_bf16_linear(self, x: Tensor, data: Tensor, native_id: int, in_features: int,
                         bias: Tensor | None) -> Tensor | None:
        """Many bf16 rows x [m, k] against GGUF blocks, each strip of 32 weight rows decoded once to bf16 and
        multiplied with AMX -> [m, n] bf16; None without AMX or for another input."""
        if not _usable(x, data) or x.dtype != torch.bfloat16 or x.shape[1] != in_features:
            return None
        n, row_bytes = data.shape
        return bf16_product(x, n, bias, lambda x_ptr, bias_ptr, y_ptr, m: self.gguf_bf16(
            native_id, x_ptr, data.data_ptr(), row_bytes, bias_ptr, y_ptr, m, n, in_features, torch.get_num_threads()))

    def gguf_dequantize(self, data: Tensor, native_id: int, in_features: int) -> Tensor | None:
        """GGUF blocks data [n, row_bytes] -> [n, in_features] float32, decoded by the C kernel's own decoder."""
        if data.device.type != "cpu" or not data.is_contiguous():
            return None
        n, row_bytes = data.shape
        out = torch.empty(n, in_features, dtype=torch.float32)
        status = self.gguf_decode(native_id, data.data_ptr(), row_bytes, out.data_ptr(), n, in_features,
                                  torch.get_num_threads())
        return out if status == 0 else None


def bind_quant_kernels(library: ctypes.CDLL) -> QuantKernels:
    p, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    signatures: dict[str, tuple[list[type], type | None]] = {
        "tgictl_qlinear_int8": ([p, p, p, c_int, p, p, i64, i64, i64, c_int], None),
        "tgictl_qlinear_int8_bf16": ([p, p, p, p, p, i64, i64, i64, c_int], c_int),
        "tgictl_qlinear_int4": ([p, p, p, c_int, i64, p, p, i64, i64, i64, i64, c_int], c_int),
        "tgictl_qlinear_int4_rows_bf16": ([p, p, p, c_int, i64, p, p, i64, i64, i64, i64, c_int], c_int),
        "tgictl_int4_rows_bf16_available": ([], c_int),
        "tgictl_qlinear_int4_bf16": ([p, p, p, c_int, i64, p, p, i64, i64, i64, c_int], c_int),
        "tgictl_int4_bf16_path": ([], c_int),
        "tgictl_qlinear_gguf": ([c_int, p, p, i64, p, p, i64, i64, i64, c_int], c_int),
        "tgictl_gguf_dequantize": ([c_int, p, i64, p, i64, i64, c_int], c_int),
        "tgictl_qlinear_gguf_bf16": ([c_int, p, p, i64, p, p, i64, i64, i64, c_int], c_int),
        "tgictl_q6_k_rows_bf16_available": ([], c_int),
    }
    functions = []
    for name, (argtypes, restype) in signatures.items():
        fn = getattr(library, name)
        fn.argtypes = argtypes
        fn.restype = restype
        functions.append(fn)
    return QuantKernels(*functions)


@functools.cache
def quant_kernels() -> QuantKernels | None:
    """The bound kernels, or None when the native library is unavailable (kernels/native.py said why)."""
    native = load_native_kernels()
    return None if native is None else bind_quant_kernels(native.library)
