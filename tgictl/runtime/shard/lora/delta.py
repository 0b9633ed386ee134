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

from tgictl.kernels.lora import AdapterGroups, add_lora
from tgictl.runtime.shard.lora.adapter_files import LoraAdapter

# (projection, first, stop): the part of one projection a rank holds: output rows for a
# column-parallel layer, input columns for a row-parallel one.
ProjectionPart = tuple[str, int, int]


class LoraDelta(nn.Module):
    """a: [N, in_per_rank, P * R]; bs: per projection B^T [N, R, out_p] (scaling folded in), at the
    output columns `firsts` of the layer's fused output."""

    def __init__(self, a: Tensor, bs: Sequence[Tensor], firsts: Sequence[int]) -> None:
        super().__init__()
        self.a = nn.Parameter(a, requires_grad=False)
        self.bs = nn.ParameterList(nn.Parameter(b, requires_grad=False) for b in bs)
        self.firsts = tuple(firsts)

    def add_to(self, x: Tensor, y: Tensor, groups: AdapterGroups) -> Tensor:
        """y += each token's delta, in place (x: [T, in_per_rank], y: [T, out])."""
        return add_lora(x, y, self.a, list(zip(self.firsts, self.bs)), groups)

    @property
    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())


def factor_dtype(model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """float32 on CPU (bf16 bmm at LoRA's small shapes is 3-4x slower there, and PEFT saves float32
    factors, so memory stays the adapters' own size); the model's dtype on CUDA."""
    return torch.float32 if device.type == "cpu" else model_dtype


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
    a = torch.zeros(count, in_features, len(parts) * rank, dtype=dtype)
    bs = [torch.zeros(count, rank, out, dtype=dtype) for out in outs]
    for k, adapter in enumerate(adapters):
        for p, (projection, start, stop) in enumerate(parts):
            factors = adapter.factors.get((layer, projection))
            if factors is None:
                continue  # zeros: this adapter leaves the projection as it is
            r = adapter.rank
            fa = factors.a[:, start:stop] if split_inputs else factors.a  # [r, in_per_rank]
            fb = factors.b if split_inputs else factors.b[start:stop]  # [out_p, r]
            a[k, :, p * rank : p * rank + r] = fa.T.to(dtype)
            bs[p][k, :r] = (fb.to(dtype) * adapter.scaling).T
    firsts = [sum(outs[:p]) for p in range(len(outs))]
    return LoraDelta(a.to(device), [b.to(device) for b in bs], firsts)
