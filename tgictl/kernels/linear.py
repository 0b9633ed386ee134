"""The one linear-layer entry point the shard's layers call: torch's matmul, or for a few rows on CPU
the compiled matrix-vector kernel (kernels/native.py, csrc/small_linear.c).

Why: at one to a few rows a linear layer only streams its weights; torch's bf16 matmul reaches a
fraction of the memory bandwidth there, and batch-1 decode spent most of its step in it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tgictl.kernels.native import load_native_kernels

# Up to this many rows the native kernel wins (scripts/bench_linear.py, SmolLM2 shapes, 2 threads:
# bf16 at 1 row 2.1x less time over a layer's projections and the LM head, at 2 rows 1.7x, at 4 rows
# slower on the per-layer shapes; float32 still 1.5x at 8 rows); above it oneDNN's matmul, which
# reuses each weight across rows in registers, is faster.
SMALL_LINEAR_MAX_ROWS: dict[torch.dtype, int] = {torch.bfloat16: 2, torch.float32: 8}


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x: [rows, in] -> [rows, out] = x @ weight.T + bias, in x's dtype."""
    if x.device.type == "cpu" and x.shape[0] <= SMALL_LINEAR_MAX_ROWS.get(x.dtype, 0) \
            and (native := load_native_kernels()) is not None:
        out = native.small_linear(x, weight, bias)
        if out is not None:
            return out
    return F.linear(x, weight, bias)
