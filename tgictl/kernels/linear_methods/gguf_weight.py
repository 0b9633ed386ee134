"""A GGUF tensor kept in its quantized blocks: W [out, in] as out rows of in / block_size blocks.

The matmul reads the blocks directly (csrc/gguf_linear.c); the reference dequantizes them with
gguf_types.py. Tensor-parallel slicing is on the blocks: any output rows, input columns only on block
boundaries (`slice_columns` answers None elsewhere and the loader dequantizes that slice instead).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from tgictl.kernels.linear import native_replaces_packed_copy
from tgictl.kernels.linear_methods.base import LinearFn, LinearWeight, with_common
from tgictl.kernels.linear_methods.gguf_types import BlockType
from tgictl.kernels.linear_methods.native import quant_kernels


class GGUFWeight(LinearWeight):
    method = "gguf"

    def __init__(self, data: Tensor, block_type: BlockType, in_features: int, dtype: torch.dtype) -> None:
        super().__init__(data.shape[0], in_features, dtype)
        if in_features % block_type.block_size or data.shape[1] != in_features // block_type.block_size * block_type.type_size:
            raise ValueError(f"{block_type.name} rows of {in_features} weights need "
                             f"{in_features // block_type.block_size * block_type.type_size} bytes, not {data.shape[1]}")
        self.block_type = block_type
        self.register_buffer("data", data)  # [out, in / block_size * type_size] uint8

    @property
    def format_key(self) -> str:
        return self.block_type.name

    def dequantize(self) -> Tensor:
        return self.block_type.dequantize(self.data)

    def dequantize_rows(self, rows: Tensor) -> Tensor:
        """By the C decoder where it is built (the reference's values bit for bit, csrc/gguf_linear.c): an
        embedding lookup per decode step, where the reference's ~10 torch calls cost ~50-100 us per token."""
        picked = self.data.index_select(0, rows)
        kernels = quant_kernels()
        decoded = None if kernels is None else kernels.gguf_dequantize(picked, self.block_type.native_id,
                                                                         self.in_features)
        return decoded if decoded is not None else self.block_type.dequantize(picked)

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def backends(self) -> Mapping[str, LinearFn]:
        return GGUF_BACKENDS

    def wants_packed_copy(self, policy: str) -> bool:
        """Under `auto`, no packed bf16 copy where the AMX or VDPBF16PS kernel multiplies strips decoded from
        the blocks themselves (csrc/decoded_linear.h): on the default GGUF's Q8_0 LM head AMX is faster than
        oneDNN on the copy up to 32 rows (4.0-4.2 ms at 5-32 rows against 5.5-8.6) and the copy would cost
        54 MiB; at 64 rows the copy was faster (6.5 against 10.1)."""
        return not native_replaces_packed_copy(policy)

    def slice_rows(self, start: int, stop: int) -> GGUFWeight:
        return GGUFWeight(self.data[start:stop].contiguous(), self.block_type, self.in_features, self.dtype)

    def slice_columns(self, start: int, stop: int) -> GGUFWeight | None:
        """Input columns [start, stop) as blocks, or None when they do not start and end on block boundaries."""
        size, width = self.block_type.block_size, self.block_type.type_size
        if start % size or stop % size:
            return None
        part = self.data[:, start // size * width : stop // size * width].contiguous()
        return GGUFWeight(part, self.block_type, stop - start, self.dtype)

    @classmethod
    def concat_rows(cls, parts: Sequence[LinearWeight]) -> LinearWeight | None:
        typed = [p for p in parts if isinstance(p, GGUFWeight)]
        first = typed[0]
        if any(p.block_type != first.block_type or p.in_features != first.in_features for p in typed):
            return None
        return cls(torch.cat([p.data for p in typed]), first.block_type, first.in_features, first.dtype)


def _native_gguf(weight: LinearWeight, x: Tensor, bias: Tensor | None) -> Tensor | None:
    """The float32 kernel (csrc/gguf_linear.c), but bf16 rows of Q6_K go to the VDPBF16PS kernel on its blocks
    where it is built (csrc/gguf_q6_k_rows.c): the float32 kernel decodes Q6_K one weight at a time, ~12x slower
    on a 1B model's tied LM head (128256 x 2048, 215 MB) at one row."""
    assert isinstance(weight, GGUFWeight)
    kernels = quant_kernels()
    if kernels is None:
        return None
    if weight.block_type.name == "Q6_K" and x.dtype == torch.bfloat16 and kernels.q6_k_rows_built:
        out = _native_gguf_bf16(weight, x, bias)
        if out is not None:
            return out
    return kernels.gguf_linear(x, weight.data, weight.block_type.native_id, weight.in_features, bias)


def _native_gguf_bf16(weight: LinearWeight, x: Tensor, bias: Tensor | None) -> Tensor | None:
    assert isinstance(weight, GGUFWeight)
    kernels = quant_kernels()
    if kernels is None:
        return None
    return kernels.gguf_bf16_linear(x, weight.data, weight.block_type.native_id, weight.in_features, bias)


GGUF_BACKENDS: Mapping[str, LinearFn] = with_common({"native": _native_gguf, "native_bf16": _native_gguf_bf16})
