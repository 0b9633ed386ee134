"""The MoE router: which k experts each token goes to, and with what weight (kernels/moe.py's `route`).

Its weight [experts, hidden] is small and decides everything after it, so it is kept in the serving dtype under
every --quantize method and read as floats from a GGUF file (llama.cpp keeps it in F32), replicated on every
tensor-parallel rank: the ranks see the same hidden states and so route every token alike, with no communication.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tgictl.kernels.linear import linear
from tgictl.kernels.moe import route


class TopKRouter(nn.Module):
    def __init__(self, weight: Tensor, top_k: int, *, normalize: bool, weights_in_float32: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [experts, hidden]
        self.top_k = top_k
        self.normalize = normalize
        self.weights_in_float32 = weights_in_float32

    @property
    def num_experts(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x: [tokens, hidden] -> (expert ids [tokens, top_k] int64, routing weights [tokens, top_k] float32).

        The logits are computed in x's dtype, as transformers computes them; the weights stay float32 (Mixtral)
        or are rounded to x's dtype first (Qwen3-MoE), still returned as float32 values."""
        ids, weights = route(linear(x, self.weight), self.top_k, self.normalize)
        if not self.weights_in_float32:
            weights = weights.to(x.dtype).float()
        return ids, weights
