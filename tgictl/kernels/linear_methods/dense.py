"""The unquantized format: W as a float tensor in the serving dtype, multiplied by kernels/linear.py (torch's
matmul, the C matrix-vector kernel for a few rows). What every model serves without --quantize."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgictl.kernels.linear import linear
from tgictl.kernels.linear_methods.base import LinearWeight


class DenseWeight(LinearWeight):
    method = "dense"

    def __init__(self, weight: Tensor) -> None:
        super().__init__(weight.shape[0], weight.shape[1], weight.dtype)
        self.weight = nn.Parameter(weight, requires_grad=False)  # [out, in]

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
        return linear(x, self.weight, bias)

    @classmethod
    def concat_rows(cls, parts: Sequence[LinearWeight]) -> LinearWeight:
        return cls(torch.cat([p.weight for p in parts if isinstance(p, DenseWeight)]))
