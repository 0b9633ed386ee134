"""Gated SiLU MLP: down(silu(gate(x)) * up(x)), with gate and up fused into one column-parallel matmul.

silu(gate) * up runs as one compiled call on CPU (kernels/fused.py); `torch_activation` is its reference.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from tgictl.kernels import fused
from tgictl.kernels.lora import AdapterGroups
from tgictl.runtime.shard.layers.linear import ColumnParallelLinear, RowParallelLinear
from tgictl.runtime.shard.weights import Weights


class GatedMLP(nn.Module):
    def __init__(self, gate_up: ColumnParallelLinear, down: RowParallelLinear) -> None:
        super().__init__()
        self.gate_up = gate_up  # [hidden] -> [2 * intermediate_per_rank]: gate rows, then up rows
        self.down = down  # [intermediate_per_rank] -> [hidden], all-reduced over ranks

    @classmethod
    def load(cls, weights: Weights, prefix: str, *, bias: bool) -> GatedMLP:
        """prefix: e.g. "model.layers.0.mlp" with gate_proj, up_proj, down_proj below it.

        One split of the intermediate features serves gate/up (output rows) and down (input columns); it
        falls on down's group or block boundaries, so a quantized down splits into whole groups.
        """
        start, stop = weights.column_split(f"{prefix}.down_proj.weight")
        gate_up = ColumnParallelLinear.load_ranges(
            weights, [(f"{prefix}.gate_proj", start, stop), (f"{prefix}.up_proj", start, stop)], bias=bias
        )
        down = RowParallelLinear.load_columns(weights, f"{prefix}.down_proj", start, stop, bias=bias)
        return cls(gate_up, down)

    def forward(self, x: Tensor, adapters: AdapterGroups | None = None) -> Tensor:
        """x: [tokens, hidden] -> [tokens, hidden]; adapters: x's tokens by LoRA adapter, if any."""
        gate_up = self.gate_up(x, adapters)  # [tokens, 2 * intermediate_per_rank]: gate, then up
        activated = fused.silu_mul(gate_up)
        return self.down(self.torch_activation(gate_up) if activated is None else activated, adapters)

    @staticmethod
    def torch_activation(gate_up: Tensor) -> Tensor:
        """[tokens, 2 * inter] -> silu(gate) * up [tokens, inter]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
