"""The LoRA delta of one tensor-parallel linear, for every loaded adapter: an additive module the
linear applies after its base product (before the all-reduce of a row-parallel one), so the base
path stays as it is (docs/architecture.md, "Multi-LoRA").

Tensor parallelism splits the factors as the layer is split: a column-parallel layer (q|k|v,
gate|up) holds its rows of B and all of A; a row-parallel one (o, down) its columns of A and all of
B, so each rank's partial delta joins the partial output in the one all-reduce that sums them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from tgictl.kernels.lora import AdapterGroups, LoraFactors, add_lora
from tgictl.kernels.native import load_native_kernels
from tgictl.runtime.shard.lora.adapter_files import LoraAdapter

# (projection, first, stop): the part of one projection a rank holds: output rows for a
# column-parallel layer, input columns for a row-parallel one.
ProjectionPart = tuple[str, int, int]


class LoraDelta(nn.Module):
    """a: [N, in_per_rank, P * R]; b: [N, R, out] every projection's B^T side by side (scaling folded
    in), projection p at the output columns bounds[p] .. bounds[p + 1] of the layer's fused output."""

    def __init__(self, a: Tensor, b: Tensor, bounds: Sequence[int]) -> None:
        super().__init__()
        self.a = nn.Parameter(a, requires_grad=False)
        self.b = nn.Parameter(b, requires_grad=False)
        self.factors = LoraFactors(self.a, self.b, tuple(bounds))

    def add_to(self, x: Tensor, y: Tensor, groups: AdapterGroups) -> Tensor:
        """y += each token's delta, in place (x: [T, in_per_rank], y: [T, out])."""
        return add_lora(x, y, self.factors, groups)

    @property
    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())


def factor_dtype(model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The model's dtype, as TGI and vLLM keep the factors; on CPU without the compiled kernel
    (csrc/lora.c) float32, because torch's bf16 bmm at LoRA's small shapes is 3-4x slower there."""
    if device.type == "cpu" and model_dtype == torch.bfloat16 and load_native_kernels() is None:
        return torch.float32
    return model_dtype


def build_delta(
    adapters: Sequence[LoraAdapter], layer: int, parts: Sequence[ProjectionPart], *, split_inputs: bool,
    device: torch.device,
) -> LoraDelta | None:
    """The delta of a linear fusing `parts` in `layer`; None when no adapter targets any of them.

    split_inputs: the layer is row-parallel (parts are input columns; one part)."""
    present = [adapter for adapter in adapters if any((layer, p) in adapter.factors for p, _, _ in parts)]
    if not present:
        return None
    rank = max(adapter.rank for adapter in present)
    first = next(f for adapter in present for p, _, _ in parts if (f := adapter.factors.get((layer, p))))
    dtype = factor_dtype(first.a.dtype, device)
    in_features = parts[0][2] - parts[0][1] if split_inputs else first.a.shape[1]
    outs = [first.b.shape[0] if split_inputs else stop - start for _, start, stop in parts]
    count = len(adapters)
    bounds = [sum(outs[:p]) for p in range(len(outs) + 1)]
    a = torch.zeros(count, in_features, len(parts) * rank, dtype=dtype)
    b = torch.zeros(count, rank, bounds[-1], dtype=dtype)
    for k, adapter in enumerate(adapters):
        for p, (projection, start, stop) in enumerate(parts):
            factors = adapter.factors.get((layer, projection))
            if factors is None:
                continue  # zeros: this adapter leaves the projection as it is
            r = adapter.rank
            fa = factors.a[:, start:stop] if split_inputs else factors.a  # [r, in_per_rank]
            fb = factors.b if split_inputs else factors.b[start:stop]  # [out_p, r]
            a[k, :, p * rank : p * rank + r] = fa.T.to(dtype)
            b[k, :r, bounds[p] : bounds[p + 1]] = (fb.float() * adapter.scaling).T.to(dtype)  # one rounding
    return LoraDelta(a.to(device), b.to(device), bounds)
