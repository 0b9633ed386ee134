"""The unquantized format: W as a float tensor in the serving dtype, multiplied by kernels/linear.py (torch's
matmul, the C matrix-vector kernel for a few rows), or for more rows on CPU by oneDNN on a prepacked copy
(kernels/prepacked.py). What every model serves without --quantize."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgictl.kernels.linear import linear, native_first, native_replaces_packed_copy
from tgictl.kernels.prepacked import prepack
from tgictl.kernels.linear_methods.base import LinearWeight


class DenseWeight(LinearWeight):
    method = "dense"

    def __init__(self, weight: Tensor) -> None:
        super().__init__(weight.shape[0], weight.shape[1], weight.dtype)
        self.weight = nn.Parameter(weight, requires_grad=False)  # [out, in]

    def wants_packed_copy(self, policy: str) -> bool:
        """Under `auto`, no copy where the AMX or VDPBF16PS kernel reads the weight as stored: each is as fast
        as oneDNN's copy up to 32 rows, the copy only wins at 33-64 (see kernels/linear.py), and it costs the
        weights' bytes again (SmolLM2 bf16: 258 MiB, a quarter of the shard)."""
        return not native_replaces_packed_copy(policy)

    def prepack(self) -> bool:
        self.onednn_weight = prepack(self.weight)  # the weight itself: no dequantized copy first
        return self.onednn_weight is not None

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
        # The one dense path (no table lookup): kernels/linear.py where it has a kernel of its own for this
        # row count that beats the packed copy (matrix-vector; AMX or VDPBF16PS up to 32 rows), else the packed
        # copy for many rows where there is one, else kernels/linear.py (AMX up to 64 rows, torch above).
        packed = None if native_first(x) else self.packed_matmul(x, bias)
        return packed if packed is not None else linear(x, self.weight, bias)

    @classmethod
    def concat_rows(cls, parts: Sequence[LinearWeight]) -> LinearWeight:
        return cls(torch.cat([p.weight for p in parts if isinstance(p, DenseWeight)]))
