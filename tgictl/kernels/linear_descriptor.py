"""A projection as the C loops read it (csrc/linear_desc.h): pointers into a `LinearWeight` of a format whose C
kernels they call (dense bf16 rows, int4 tiles, int8 rows), for kernels/decode_layers.py's decoder layers and
kernels/moe.py's experts. The loops multiply it with the kernels the Python dispatch takes for the same row count,
so they compute what the Python layers compute."""

from __future__ import annotations

import ctypes

import torch

from tgictl.kernels.linear import amx_available, dpbf16_linear_available, fma_linear_available
from tgictl.kernels.linear_methods import DenseWeight, Int4Weight, Int8Weight, LinearWeight
from tgictl.kernels.linear_methods.native import int4_sz_form, quant_kernels


class LinearDescriptor(ctypes.Structure):
    """csrc/linear_desc.h's linear_desc: bf16 rows (group 0), int4 tiles or int8 rows (group INT8_ROWS)."""

    _fields_ = [("weight", ctypes.c_void_p), ("scales_zeros", ctypes.c_void_p), ("group", ctypes.c_int64),
                ("k_pad", ctypes.c_int64), ("sz_form", ctypes.c_int64)]


INT8_ROWS = -1  # csrc/linear_desc.h's INT8_ROWS: the group that marks int8 rows


def linear_descriptor(weight: LinearWeight, out_in: tuple[int, int]) -> LinearDescriptor | None:
    """The loops' view of one projection, or None when it is of a format or shape they cannot read. The pointers
    stay valid while `weight` lives and is not moved (weights never move after load)."""
    if (weight.out_features, weight.in_features) != out_in:
        return None
    if isinstance(weight, DenseWeight):
        w = weight.weight
        ok = w.device.type == "cpu" and w.dtype == torch.bfloat16 and w.is_contiguous()
        return LinearDescriptor(w.data_ptr(), None, 0, 0, 0) if ok else None
    if isinstance(weight, Int4Weight):
        packed, sz = weight.packed, weight.scales_zeros
        ok = packed.device.type == "cpu" and sz.dtype == torch.bfloat16 and packed.is_contiguous() \
            and sz.is_contiguous()
        return LinearDescriptor(packed.data_ptr(), sz.data_ptr(), weight.group_size, weight.padded_in_features,
                                int4_sz_form(sz)) if ok else None
    if isinstance(weight, Int8Weight):
        q, scales = weight.qweight, weight.scales
        ok = q.device.type == "cpu" and scales.dtype == torch.bfloat16 and q.is_contiguous() and scales.is_contiguous()
        return LinearDescriptor(q.data_ptr(), scales.data_ptr(), INT8_ROWS, 0, 0) if ok else None
    return None


def runs_many_rows(weight: LinearWeight) -> bool:
    """Whether the loops' many-row kernel for this projection runs here (it then equals the Python layers')."""
    if isinstance(weight, Int4Weight):
        kernels = quant_kernels()
        return kernels is not None and kernels.int4_bf16_instructions != "none" \
            and weight.padded_in_features == weight.in_features
    if isinstance(weight, Int8Weight):  # rows decoded per strip for AMX or VDPBF16PS (csrc/int8_linear.c)
        return (amx_available() or dpbf16_linear_available()) and weight.in_features % 32 == 0
    return (amx_available() and weight.in_features % 32 == 0) \
        or (dpbf16_linear_available() and weight.in_features % 4 == 0) \
        or (fma_linear_available() and weight.in_features % 16 == 0)
