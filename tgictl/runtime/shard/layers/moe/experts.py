"""The experts of one MoE layer: each a gated SiLU MLP, down(silu(gate(x)) * up(x)), with gate and up fused into
one weight as in the dense MLP (layers/mlp.py), every projection a `LinearWeight` in the model's weight format
(dense, --quantize int8/int4, GGUF blocks), so every format serves experts as it serves any projection.

Two forwards compute the same sum:
- `forward`, the grouped path the shard runs: the token-expert pairs sorted by expert once (kernels/moe.py), then
  one product per active expert on its contiguous rows (one read of its weights for all its tokens; experts no
  token chose are never read), and one weighted sum back to the tokens. On CPUs the experts of few rows (a decode
  step's) run in one compiled call (kernels/moe_experts.py) that makes the same kernel calls as `expert_mlp`;
- `reference`, a plain loop over every expert with a mask of the tokens that chose it, as transformers' eager
  experts run: what the grouped path is tested against.

Tensor parallelism: every expert's intermediate features are split over the ranks as the dense MLP's are (gate/up
output rows, down input columns, on the format's group boundaries), so each rank holds a slice of every expert and
computes its part of every chosen expert; the block sums the ranks' partial outputs in one all-reduce. At any
routing every rank does the same share of the work (expert parallelism would leave a rank idle whenever a token's
experts fall on another), and uneven splits work as they do for the dense MLP.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from tgictl.kernels import fused
from tgictl.kernels.linear_methods import LinearWeight
from tgictl.kernels.moe import ExpertGroups
from tgictl.kernels.moe_experts import ExpertStack, Span, native_experts
from tgictl.runtime.shard.layers.mlp import gated_activation
from tgictl.runtime.shard.moe_config import MoEConfig
from tgictl.runtime.shard.weights import Weights


class Experts(nn.Module):
    def __init__(self, gate_up: list[LinearWeight], down: list[LinearWeight]) -> None:
        super().__init__()
        if not gate_up or len(gate_up) != len(down):
            raise ValueError("every expert needs a gate_up and a down weight")
        self.gate_up = nn.ModuleList(gate_up)  # expert e: [2 * intermediate_per_rank, hidden]: gate rows, then up
        self.down = nn.ModuleList(down)  # expert e: [hidden, intermediate_per_rank]
        self._stack: ExpertStack | bool | None = None  # expert_stack(): None until decided

    @classmethod
    def load(cls, weights: Weights, layer_prefix: str, moe: MoEConfig) -> Experts:
        """This rank's slice of every expert of the layer at `layer_prefix` (e.g. "model.layers.3")."""
        names = moe.names

        def name(expert: int, projection: str) -> str:
            return names.expert(layer_prefix, expert, projection)

        # One split serves every expert (they share a shape and, in a file, a format).
        start, stop = weights.column_split(name(0, names.down))
        gate_up, down = [], []
        for expert in range(moe.num_experts):
            gate_up.append(weights.linear_rows([(name(expert, names.gate), start, stop),
                                                (name(expert, names.up), start, stop)]))
            down.append(weights.linear_columns(name(expert, names.down), start, stop))
        return cls(gate_up, down)

    @property
    def num_experts(self) -> int:
        return len(self.gate_up)

    def expert_mlp(self, expert: int, x: Tensor, *, fused_activation: bool = True) -> Tensor:
        """Expert `expert`'s MLP on x [rows, hidden] -> [rows, hidden] (this rank's part of it)."""
        gate_up = self.gate_up[expert](x)
        activated = fused.silu_mul(gate_up) if fused_activation else None
        return self.down[expert](gated_activation(gate_up, "silu") if activated is None else activated)

    def forward(self, x: Tensor, ids: Tensor, weights: Tensor) -> Tensor:
        """x: [tokens, hidden]; ids, weights: the router's [tokens, top_k] -> each token's weighted sum of its
        experts' outputs (this rank's part), [tokens, hidden] float32."""
        groups = ExpertGroups.build(ids, self.num_experts)
        return groups.combine(self.grouped_outputs(groups.gather(x), groups.spans), weights)

    def grouped_outputs(self, rows: Tensor, spans: Sequence[Span]) -> Tensor:
        """rows: [pairs, hidden] grouped by expert, spans: each active expert's (expert, first, stop) rows ->
        [pairs, hidden], each row's expert output: one product per active expert."""
        outputs = torch.empty_like(rows)
        stack = self.expert_stack()
        left = spans if stack is None else native_experts(stack, rows, spans, outputs)
        for expert, start, stop in left:  # those the C loop did not take (a prompt's many rows, float32)
            outputs[start:stop] = self.expert_mlp(expert, rows[start:stop])
        return outputs

    def expert_stack(self) -> ExpertStack | None:
        """The experts as csrc/moe_experts.c reads them; decided once, on the first forward (after load, when the
        weights no longer move)."""
        if self._stack is None:
            self._stack = ExpertStack.build(list(self.gate_up), list(self.down)) or False
        return self._stack or None

    def reference(self, x: Tensor, ids: Tensor, weights: Tensor) -> Tensor:
        """`forward` as a loop over every expert, in torch ops: the tokens that chose it, its MLP on them, their
        weighted outputs added to a float32 sum."""
        total = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for expert in range(self.num_experts):
            token, choice = torch.nonzero(ids == expert, as_tuple=True)
            if token.numel() == 0:
                continue
            out = self.expert_mlp(expert, x[token], fused_activation=False)
            total.index_add_(0, token, out.float() * weights[token, choice].unsqueeze(1))
        return total
