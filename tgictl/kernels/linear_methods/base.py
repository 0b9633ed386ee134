"""One linear layer's weight in one storage format, and the matmuls that read it (docs/architecture.md,
"Weight formats").

A `LinearWeight` is the matrix W [out_features, in_features] of y = x W^T + b, held the way its format
holds it (bf16 values, int8 rows and scales, int4 tiles, GGUF blocks). Every format defines the exact
values it stands for (`dequantize`, pure torch: the reference) and registers the matmuls that compute on
the stored form ("backends"); `forward` runs the first backend the dispatch table chooses for this shape
and row count that accepts the input, falling back to the reference. The layers never look inside.

Backends every format has:
- "reference": float32 matmul on the float32 dequantization; what the faster paths are tested against.
- "dequant": dequantize into the activations' dtype, then torch's matmul (oneDNN, AMX in bf16): the
  weight is rebuilt on every call, which pays off only when many rows share it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgictl.kernels.batch_invariance import batch_invariant, in_row_blocks
from tgictl.kernels.linear import SMALL_LINEAR_MAX_ROWS, fma_linear_available, linear
from tgictl.kernels.linear_methods import dispatch
from tgictl.kernels.prepacked import PACKED_MAX_ROWS, packed_linear, packed_rows, prepack

# (weight, x [rows, in], bias [out] or None) -> [rows, out] in x's dtype, or None: "not for this input".
LinearFn = Callable[["LinearWeight", Tensor, "Tensor | None"], "Tensor | None"]


class LinearWeight(nn.Module, ABC):
    """W [out_features, in_features] in one format; `forward(x, bias)` = x W^T + bias."""

    method: ClassVar[str]  # the registry name (linear_methods/registry.py)

    def __init__(self, out_features: int, in_features: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.out_features = out_features
        self.in_features = in_features
        self.dtype = dtype  # of the activations it is served with, and of its outputs

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    @property
    def device(self) -> torch.device:
        return next(t.device for t in (*self.parameters(), *self.buffers()))

    @property
    def format_key(self) -> str:
        """The method and its parameters as the dispatch table keys them, e.g. `int4/g64`, `Q4_1`."""
        return self.method

    @abstractmethod
    def dequantize(self) -> Tensor:
        """[out, in] float32: exactly the values the stored form stands for."""

    @abstractmethod
    def dequantize_rows(self, rows: Tensor) -> Tensor:
        """rows: [n] int64 output rows -> [n, in] float32 (an embedding lookup reads these)."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes the stored form occupies."""

    def backends(self) -> Mapping[str, LinearFn]:
        """Name -> matmul over the stored form, "reference" and "dequant" included."""
        return COMMON_BACKENDS

    def embedding(self, ids: Tensor) -> Tensor:
        """ids: [tokens] int64 -> [tokens, in] in the serving dtype (rows of W as an embedding table)."""
        return self.dequantize_rows(ids).to(self.dtype)

    # A bf16 copy of W in oneDNN's blocked layout for the products of more rows than the matrix-vector
    # kernels serve (kernels/prepacked.py); set by prepack(), never a parameter or buffer.
    onednn_weight: Tensor | None = None
    # Where oneDNN has no bf16 kernels to pack for (AVX2 CPUs without AVX512-BW), the plain bf16 [out, in]
    # dequantization instead, which csrc/fma_linear.c multiplies as stored (kernels/linear.py) at any row
    # count above the matrix-vector range; set by prepack() like the packed copy, at the same cost in bytes.
    plain_bf16_weight: Tensor | None = None

    def wants_packed_copy(self, policy: str) -> bool:
        """Whether this weight should get a packed copy under TGICTL_PREPACK_WEIGHTS=`policy` (before the
        memory check): formats whose own kernels match the copy's speed say no under `auto`."""
        return True

    def prepack(self) -> bool:
        """Hold a packed bf16 copy of W (dense: the weight itself; other formats: their dequantization)."""
        if self.dtype != torch.bfloat16 or self.device.type != "cpu":
            return False
        weight = self.dequantize().to(torch.bfloat16)
        self.onednn_weight = prepack(weight)
        if self.onednn_weight is None and fma_linear_available() and self.in_features % 16 == 0:
            self.plain_bf16_weight = weight.contiguous()
        return self.onednn_weight is not None or self.plain_bf16_weight is not None

    def packed_matmul(self, x: Tensor, bias: Tensor | None) -> Tensor | None:
        """x W^T + bias on the packed copy (or the plain bf16 one), or None where it does not serve x (no copy,
        not bf16, a row count outside kernels/prepacked.py's decode range or, for the plain copy, up to 4)."""
        rows = x.shape[0]
        if self.plain_bf16_weight is not None and x.dtype == torch.bfloat16 \
                and rows > SMALL_LINEAR_MAX_ROWS[torch.bfloat16]:
            return linear(x, self.plain_bf16_weight, bias)
        if self.onednn_weight is None or x.dtype != torch.bfloat16 \
                or not SMALL_LINEAR_MAX_ROWS[torch.bfloat16] < rows <= PACKED_MAX_ROWS:
            return None
        measured = dispatch.padded_rows(x)  # the per-CPU table's row count where one was measured faster
        padded = measured if measured != rows else packed_rows(rows)
        if padded > rows:
            return packed_linear(F.pad(x, (0, 0, 0, padded - rows)), self.onednn_weight, bias)[:rows]
        return packed_linear(x, self.onednn_weight, bias)

    def forward(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """x: [rows, in] -> [rows, out] in x's dtype; in fixed row blocks under --batch-invariant."""
        if batch_invariant():
            return in_row_blocks(lambda rows: self.matmul(rows, bias), x)
        return self.matmul(x, bias)

    def matmul(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """x W^T + bias by the first backend the dispatch table chooses that takes x (the packed copy first)."""
        packed = self.packed_matmul(x, bias)
        if packed is not None:
            return packed
        backends = self.backends()
        for name in dispatch.backend_order(self, x):
            fn = backends.get(name)  # the table may name a backend this format lacks (torch's, for GGUF)
            out = fn(self, x, bias) if fn is not None else None
            if out is not None:
                return out
        return reference_linear(self, x, bias)

    @classmethod
    def concat_rows(cls, parts: Sequence[LinearWeight]) -> LinearWeight | None:
        """One weight holding `parts` stacked along the output rows, or None when their storage does not
        allow it (then the layer runs them side by side, see StackedLinearWeight)."""
        return None


def reference_linear(weight: LinearWeight, x: Tensor, bias: Tensor | None) -> Tensor:
    """The float32 matmul on the float32 dequantization, rounded once to x's dtype."""
    out = F.linear(x.float(), weight.dequantize().to(x.device), None if bias is None else bias.float())
    return out.to(x.dtype)


def dequant_linear(weight: LinearWeight, x: Tensor, bias: Tensor | None) -> Tensor:
    """Dequantize into x's dtype, then the shard's matmul (kernels/linear.py: torch's, or the C kernels where
    torch's is slow) for many rows, where the rebuild is amortised."""
    return linear(x, weight.dequantize().to(device=x.device, dtype=x.dtype), bias)


COMMON_BACKENDS: Mapping[str, LinearFn] = MappingProxyType({"reference": reference_linear, "dequant": dequant_linear})


def with_common(backends: Mapping[str, LinearFn]) -> Mapping[str, LinearFn]:
    """A format's own backends next to the common ones."""
    return MappingProxyType({**COMMON_BACKENDS, **backends})


class StackedLinearWeight(LinearWeight):
    """Projections whose storage cannot be concatenated (two GGUF block types, say) run one after the other
    on the same input; their outputs are concatenated, as one fused weight's would be."""

    method = "stacked"

    def __init__(self, parts: Sequence[LinearWeight]) -> None:
        first = parts[0]
        if any(p.in_features != first.in_features for p in parts):
            raise ValueError("stacked projections must read the same input features")
        super().__init__(sum(p.out_features for p in parts), first.in_features, first.dtype)
        self.parts = nn.ModuleList(parts)

    def dequantize(self) -> Tensor:
        return torch.cat([p.dequantize() for p in self.parts])

    def dequantize_rows(self, rows: Tensor) -> Tensor:
        return self.dequantize().index_select(0, rows)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def matmul(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        out = torch.cat([p.matmul(x) for p in self.parts], dim=-1)  # [rows, out]
        return out if bias is None else out + bias


def concat_rows(parts: Sequence[LinearWeight]) -> LinearWeight:
    """`parts` stacked along the output rows: fused into one weight when their format allows it."""
    if len(parts) == 1:
        return parts[0]
    first = type(parts[0])
    if all(type(p) is first for p in parts):
        fused = first.concat_rows(parts)
        if fused is not None:
            return fused
    return StackedLinearWeight(parts)
