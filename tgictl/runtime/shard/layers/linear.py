"""Tensor-parallel linear layers (Megatron style), over a weight in any format (kernels/linear_methods).

Column-parallel: each rank holds a slice of the OUTPUT features and needs no communication; several
projections that read the same input (q/k/v, gate/up) are concatenated once at load, so a forward runs
one bigger matmul instead of several small ones (markedly faster on CPU).
Row-parallel: each rank holds a slice of the INPUT features; partial outputs are summed with an
all-reduce and the bias is added once, after the sum.

The weight's format (dense, int8, int4, GGUF blocks) is the loader's choice (runtime/shard/weights.py);
these layers only call it (docs/architecture.md, "Weight formats").
Either may carry a LoRA delta (`lora`, runtime/shard/lora/delta.py), applied after the base product
and before the all-reduce, for the tokens of the step's AdapterGroups (docs/architecture.md, "Multi-LoRA").
The layers remember which rows or columns of which projections they hold, so the delta is split the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from tgictl.kernels.linear_methods import DenseWeight, LinearWeight
from tgictl.kernels.lora import AdapterGroups
from tgictl.runtime.shard.dist import DistContext, all_reduce
from tgictl.runtime.shard.lora.delta import LoraDelta
from tgictl.runtime.shard.weights import RowRange, Weights, split_range

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "RowRange", "as_linear_weight"]


def as_linear_weight(weight: Tensor | LinearWeight) -> LinearWeight:
    """A plain tensor is the dense format."""
    return weight if isinstance(weight, LinearWeight) else DenseWeight(weight)


class ColumnParallelLinear(nn.Module):
    def __init__(self, weight: Tensor | LinearWeight, bias: Tensor | None, parts: Sequence[RowRange] = ()) -> None:
        super().__init__()
        self.weight = as_linear_weight(weight)  # [out_per_rank, in]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)  # [out_per_rank]
        self.parts = tuple(parts)  # the projections' row ranges, in the order of the output columns
        self.lora: LoraDelta | None = None

    @classmethod
    def load_ranges(cls, weights: Weights, parts: Sequence[RowRange], *, bias: bool) -> ColumnParallelLinear:
        """Concatenate the given row ranges of several projections (prefixes) into one weight (and bias)."""
        weight = weights.linear_rows([(f"{p}.weight", start, stop) for p, start, stop in parts])
        bias_tensor = None
        if bias:
            bias_tensor = torch.cat([weights.get_range(f"{p}.bias", 0, start, stop) for p, start, stop in parts])
        return cls(weight, bias_tensor, parts)

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

    def forward(self, x: Tensor, adapters: AdapterGroups | None = None) -> Tensor:
        """x: [tokens, in] -> [tokens, out_per_rank]."""
        out = self.weight(x, self.bias)
        if self.lora is None or adapters is None:
            return out
        return self.lora.add_to(x, out, adapters)


class RowParallelLinear(nn.Module):
    def __init__(
        self, weight: Tensor | LinearWeight, bias: Tensor | None, dist: DistContext, columns: RowRange | None = None
    ) -> None:
        super().__init__()
        self.weight = as_linear_weight(weight)  # [out, in_per_rank]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)  # [out], full
        self.dist = dist
        self.columns = columns  # (projection prefix, first, stop) input columns this rank holds
        self.lora: LoraDelta | None = None

    @classmethod
    def load_columns(cls, weights: Weights, prefix: str, start: int, stop: int, *, bias: bool) -> RowParallelLinear:
        weight = weights.linear_columns(f"{prefix}.weight", start, stop)
        return cls(weight, weights.get(f"{prefix}.bias") if bias else None, weights.dist, (prefix, start, stop))

    @classmethod
    def load_sharded(cls, weights: Weights, prefix: str, *, bias: bool) -> RowParallelLinear:
        """The input columns split on the format's boundaries (runtime/shard/weights.py, column_split)."""
        start, stop = weights.column_split(f"{prefix}.weight")
        return cls.load_columns(weights, prefix, start, stop, bias=bias)

    def forward(self, x: Tensor, adapters: AdapterGroups | None = None) -> Tensor:
        """x: [tokens, in_per_rank] -> [tokens, out], summed over ranks."""
        lora = self.lora
        if not self.dist.is_sharded:
            out = self.weight(x, self.bias)
            return out if lora is None or adapters is None else lora.add_to(x, out, adapters)
        partial = self.weight(x)
        if lora is not None and adapters is not None:
            partial = lora.add_to(x, partial, adapters)  # this rank's columns of A: a partial delta
        out = all_reduce(partial, self.dist)
        return out if self.bias is None else out + self.bias
