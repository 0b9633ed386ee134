"""RMSNorm exactly as transformers computes it, in its two roundings (statistics in float32 either way):

- Llama's: the normalised values cast back to the input dtype, then times the weight (in the model's dtype);
- Gemma's and OLMo2's (`weight_in_float32`): times the weight in float32, then cast back; Gemma adds its offset
  (its checkpoints store w for a scale of 1 + w) to the float32 weight once, at load.

Both are the same in float32; in bf16 they round differently. Llama's runs on CPU in float32/bf16 as one compiled
call (kernels/fused.py), optionally with the residual add before it; `torch_forward` is the reference those calls
are tested against. `FullWidthRMSNorm` normalises all heads of q or k together (OLMo2), across tensor-parallel ranks.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tgictl.kernels import fused
from tgictl.runtime.shard.dist import DistContext, all_reduce


class RMSNorm(nn.Module):
    def __init__(self, weight: Tensor, eps: float, *, offset: float = 0.0, weight_in_float32: bool = False) -> None:
        super().__init__()
        if weight_in_float32:
            weight = weight.float() + offset
        elif offset:
            weight = (weight.float() + offset).to(weight.dtype)
        self.weight = nn.Parameter(weight, requires_grad=False)  # [dim]
        self.eps = eps
        self.weight_in_float32 = weight_in_float32

    def forward(self, x: Tensor) -> Tensor:
        """x: [..., dim] -> [..., dim] in x's dtype."""
        native = None if self.weight_in_float32 else fused.rms_norm(x, self.weight, self.eps)
        return self.torch_forward(x) if native is None else native[1]

    def add_forward(self, x: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
        """(x + delta, forward(x + delta)): the residual add and the norm after it, in one pass."""
        native = None if self.weight_in_float32 else fused.rms_norm(x, self.weight, self.eps, delta)
        if native is not None:
            return native
        total = x + delta
        return total, self.torch_forward(total)

    def torch_forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        hidden = x.float()
        hidden = self.normalized(hidden, hidden.pow(2).mean(-1, keepdim=True))
        if self.weight_in_float32:
            return (hidden * self.weight).to(dtype)
        # Weight times the value cast back, in that order: the rounding then matches transformers in bf16/fp16.
        return self.weight * hidden.to(dtype)

    def normalized(self, hidden: Tensor, variance: Tensor) -> Tensor:
        return hidden * torch.rsqrt(variance + self.eps)


class FullWidthRMSNorm(nn.Module):
    """RMSNorm over every head of q (or k) at once, as OLMo2 normalises the whole projection output. On one rank
    it is `norm` over the flattened heads; under tensor parallelism each rank holds some heads, so the sums of
    squares are all-reduced (a KV head replicated on several ranks counted once, by the first rank holding it)
    and each rank scales its own heads by its slice of the weight."""

    def __init__(self, norm: RMSNorm, total_width: int, dist: DistContext, counted: Tensor | None = None) -> None:
        super().__init__()
        self.norm = norm  # weight: this rank's slice [heads_here * head_dim]
        self.total_width = total_width
        self.dist = dist
        self.counted = counted  # [heads_here] bool: the heads this rank adds to the sum; None: all

    def forward(self, x: Tensor) -> Tensor:
        """x: [tokens, heads_here, head_dim] -> the same shape and dtype."""
        tokens = x.shape[0]
        if not self.dist.is_sharded:
            return self.norm(x.reshape(tokens, -1)).view_as(x)
        hidden = x.float()
        squares = hidden.pow(2).sum(-1)  # [tokens, heads_here]
        if self.counted is not None:
            squares = squares * self.counted
        variance = all_reduce(squares.sum(-1, keepdim=True), self.dist) / self.total_width  # [tokens, 1]
        normed = self.norm.normalized(hidden.reshape(tokens, -1), variance)
        if self.norm.weight_in_float32:
            return (normed * self.norm.weight).to(x.dtype).view_as(x)
        return (self.norm.weight * normed.to(x.dtype)).view_as(x)
