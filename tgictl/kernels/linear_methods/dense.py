"""The unquantized format: W as a float tensor in the serving dtype, multiplied by kernels/linear.py (torch's
matmul, the C matrix-vector kernel for a few rows), or for more rows on CPU by oneDNN on a prepacked copy
(kernels/prepacked.py). What every model serves without --quantize."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgictl.kernels.linear import SMALL_LINEAR_MAX_ROWS, linear
from tgictl.kernels.prepacked import packed_linear, prepack
from tgictl.kernels.linear_methods.base import LinearWeight
from tgictl.kernels.linear_methods.dispatch import padded_rows


class DenseWeight(LinearWeight):
    method = "dense"

    def __init__(self, weight: Tensor) -> None:
        super().__init__(weight.shape[0], weight.shape[1], weight.dtype)
        self.weight = nn.Parameter(weight, requires_grad=False)  # [out, in]
        # The same weight in oneDNN's layout (kernels/prepacked.py), once prepack() ran; not a parameter or
        # buffer: state dicts, slicing and device moves see the plain weight only.
        self.packed: Tensor | None = None

    def prepack(self) -> bool:
        """Hold a packed copy for the matmuls of more rows than the matrix-vector kernel takes."""
        self.packed = prepack(self.weight)
        return self.packed is not None

    def dequantize(self) -> Tensor:
        return self.weight.float()

    def dequantize_rows(self, rows: Tensor) -> Tensor:
        return self.weight.index_select(0, rows).float()

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def embedding(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight)

    def matmul(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        # The one dense path (no table lookup): kernels/linear.py already picks by row count.
        rows = x.shape[0]
        if self.packed is not None and rows > SMALL_LINEAR_MAX_ROWS[torch.bfloat16] and x.dtype == torch.bfloat16:
            padded = padded_rows(x)  # zero rows: oneDNN's kernel for some row counts is slower than for more
            if padded > rows:
                return packed_linear(F.pad(x, (0, 0, 0, padded - rows)), self.packed, bias)[:rows]
            return packed_linear(x, self.packed, bias)
        return linear(x, self.weight, bias)

    @classmethod
    def concat_rows(cls, parts: Sequence[LinearWeight]) -> LinearWeight:
        return cls(torch.cat([p.weight for p in parts if isinstance(p, DenseWeight)]))
