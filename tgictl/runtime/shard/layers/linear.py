"""Tensor-parallel linear layers (Megatron style), over a weight in any format (kernels/linear_methods).

Column-parallel: each rank holds a slice of the OUTPUT features and needs no communication; several
projections that read the same input (q/k/v, gate/up) are concatenated once at load, so a forward runs
one bigger matmul instead of several small ones (markedly faster on CPU).
Row-parallel: each rank holds a slice of the INPUT features; partial outputs are summed with an
all-reduce and the bias is added once, after the sum.

The weight's format (dense, int8, int4, GGUF blocks) is the loader's choice (runtime/shard/weights.py);
these layers only call it (docs/architecture.md, "Weight formats").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from tgictl.kernels.linear_methods import DenseWeight, LinearWeight
from tgictl.runtime.shard.dist import DistContext, all_reduce
from tgictl.runtime.shard.weights import RowRange, Weights, split_range

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "RowRange", "as_linear_weight"]


def as_linear_weight(weight: Tensor | LinearWeight) -> LinearWeight:
    """A plain tensor is the dense format."""
    return weight if isinstance(weight, LinearWeight) else DenseWeight(weight)


class ColumnParallelLinear(nn.Module):
    def __init__(self, weight: Tensor | LinearWeight, bias: Tensor | None) -> None:
        super().__init__()
        self.weight = as_linear_weight(weight)  # [out_per_rank, in]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)  # [out_per_rank]

    @classmethod
    def load_ranges(cls, weights: Weights, parts: Sequence[RowRange], *, bias: bool) -> ColumnParallelLinear:
        """Concatenate the given row ranges of several projections (prefixes) into one weight (and bias)."""
        weight = weights.linear_rows([(f"{p}.weight", start, stop) for p, start, stop in parts])
        bias_tensor = None
        if bias:
            bias_tensor = torch.cat([weights.get_range(f"{p}.bias", 0, start, stop) for p, start, stop in parts])
        return cls(weight, bias_tensor)

    @classmethod
    def load_sharded(cls, weights: Weights, prefixes: Sequence[str], *, bias: bool) -> ColumnParallelLinear:
        """Each projection split evenly over ranks by output rows; this rank's parts concatenated."""
        dist = weights.dist
        parts = []
        for prefix in prefixes:
            rows = weights.shape(f"{prefix}.weight")[0]
            start, stop = split_range(rows, dist.rank, dist.world_size)
            parts.append((prefix, start, stop))
        return cls.load_ranges(weights, parts, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """x: [tokens, in] -> [tokens, out_per_rank]."""
        return self.weight(x, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, weight: Tensor | LinearWeight, bias: Tensor | None, dist: DistContext) -> None:
        super().__init__()
        self.weight = as_linear_weight(weight)  # [out, in_per_rank]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)  # [out], full
        self.dist = dist

    @classmethod
    def load_columns(cls, weights: Weights, prefix: str, start: int, stop: int, *, bias: bool) -> RowParallelLinear:
        weight = weights.linear_columns(f"{prefix}.weight", start, stop)
        return cls(weight, weights.get(f"{prefix}.bias") if bias else None, weights.dist)

    @classmethod
    def load_sharded(cls, weights: Weights, prefix: str, *, bias: bool) -> RowParallelLinear:
        """The input columns split on the format's boundaries (runtime/shard/weights.py, column_split)."""
        start, stop = weights.column_split(f"{prefix}.weight")
        return cls.load_columns(weights, prefix, start, stop, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """x: [tokens, in_per_rank] -> [tokens, out], summed over ranks."""
        if not self.dist.is_sharded:
            return self.weight(x, self.bias)
        out = all_reduce(self.weight(x), self.dist)
        return out if self.bias is None else out + self.bias
