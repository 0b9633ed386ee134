"""RMSNorm exactly as transformers computes it (statistics in float32, weight applied in the input dtype).

On CPU in float32/bf16 it runs as one compiled call (kernels/fused.py), optionally with the residual
add before it; `torch_forward` is the reference those calls are tested against.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tgictl.kernels import fused


class RMSNorm(nn.Module):
    def __init__(self, weight: Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [dim]
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """x: [..., dim] -> [..., dim] in x's dtype."""
        native = fused.rms_norm(x, self.weight, self.eps)
        return self.torch_forward(x) if native is None else native[1]

    def add_forward(self, x: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
        """(x + delta, forward(x + delta)): the residual add and the norm after it, in one pass."""
        native = fused.rms_norm(x, self.weight, self.eps, delta)
        if native is not None:
            return native
        total = x + delta
        return total, self.torch_forward(total)

    def torch_forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        hidden = x.float()
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.eps)
        # Weight times the value cast back, in that order: the rounding then matches transformers in bf16/fp16.
        return self.weight * hidden.to(dtype)
