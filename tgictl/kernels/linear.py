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

# Up to this many rows the native kernel wins: every linear of SmolLM2-135M in bf16, weights streamed from
# memory as in a decode step, 2 threads, Sapphire Rapids: 1 row 19 ms against torch's 47, 4 rows 25 against
# 44, 5 rows 37 against 40 (the kernel passes over the weights once per 4 rows); float32 still 1.5x at 8
# rows. Above it oneDNN's matmul, which reuses each weight across rows in registers, is faster.
SMALL_LINEAR_MAX_ROWS: dict[torch.dtype, int] = {torch.bfloat16: 4, torch.float32: 8}


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x: [rows, in] -> [rows, out] = x @ weight.T + bias, in x's dtype."""
    if x.device.type == "cpu" and x.shape[0] <= SMALL_LINEAR_MAX_ROWS.get(x.dtype, 0) \
            and (native := load_native_kernels()) is not None:
        out = native.small_linear(x, weight, bias)
        if out is not None:
            return out
    return F.linear(x, weight, bias)
