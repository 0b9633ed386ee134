"""Gated MLP: down(act(gate(x)) * up(x)), with gate and up fused into one column-parallel matmul.

The activation is SiLU (Llama and most families) or GELU's tanh approximation (Gemma's gelu_pytorch_tanh).
silu(gate) * up runs as one compiled call on CPU (kernels/fused.py); `gated_activation` is its reference and
computes the other activation. Checkpoints store gate and up as two tensors or as one `gate_up_proj` (Phi-3:
gate rows, then up rows); either loads into the same fused weight.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from tgictl.kernels import fused
from tgictl.kernels.lora import AdapterGroups
from tgictl.runtime.shard.family_spec import Activation
from tgictl.runtime.shard.layers.linear import ColumnParallelLinear, RowParallelLinear
from tgictl.runtime.shard.weights import Weights


class GatedMLP(nn.Module):
    def __init__(self, gate_up: ColumnParallelLinear, down: RowParallelLinear, activation: Activation = "silu") -> None:
        super().__init__()
        self.gate_up = gate_up  # [hidden] -> [2 * intermediate_per_rank]: gate rows, then up rows
        self.down = down  # [intermediate_per_rank] -> [hidden], all-reduced over ranks
        self.activation = activation

    @classmethod
    def load(cls, weights: Weights, prefix: str, *, bias: bool, activation: Activation = "silu",
             fused_gate_up: str | None = None) -> GatedMLP:
        """prefix: e.g. "model.layers.0.mlp" with gate_proj, up_proj (or one `fused_gate_up`), down_proj below it.

        One split of the intermediate features serves gate/up (output rows) and down (input columns); it
        falls on down's group or block boundaries, so a quantized down splits into whole groups.
        """
        start, stop = weights.column_split(f"{prefix}.down_proj.weight")
        if fused_gate_up is None:
            parts = [(f"{prefix}.gate_proj", start, stop), (f"{prefix}.up_proj", start, stop)]
        else:
            fused, inter = f"{prefix}.{fused_gate_up}", weights.shape(f"{prefix}.down_proj.weight")[1]
            parts = [(fused, start, stop), (fused, inter + start, inter + stop)]
        gate_up = ColumnParallelLinear.load_ranges(weights, parts, bias=bias)
        down = RowParallelLinear.load_columns(weights, f"{prefix}.down_proj", start, stop, bias=bias)
        return cls(gate_up, down, activation)

    def forward(self, x: Tensor, adapters: AdapterGroups | None = None) -> Tensor:
        """x: [tokens, hidden] -> [tokens, hidden]; adapters: x's tokens by LoRA adapter, if any."""
        gate_up = self.gate_up(x, adapters)  # [tokens, 2 * intermediate_per_rank]: gate, then up
        activated = fused.silu_mul(gate_up) if self.activation == "silu" else None
        return self.down(gated_activation(gate_up, self.activation) if activated is None else activated, adapters)


def gated_activation(gate_up: Tensor, activation: Activation) -> Tensor:
    """[tokens, 2 * inter] (gate, then up) -> act(gate) * up [tokens, inter] in torch ops: the reference of
    fused.silu_mul, and the only path of the other activations."""
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    return F.silu(gate) * up
