"""RMSNorm exactly as transformers computes it (statistics in float32, weight applied in the input dtype)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RMSNorm(nn.Module):
    def __init__(self, weight: Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [dim]
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """x: [..., dim] -> [..., dim] in x's dtype."""
        dtype = x.dtype
        hidden = x.float()
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.eps)
        # Weight times the value cast back, in that order: the rounding then matches transformers in bf16/fp16.
        return self.weight * hidden.to(dtype)
