"""The LoRA delta of one tensor-parallel linear, for every loaded adapter: an additive module the
linear applies after its base product (before the all-reduce of a row-parallel one), so the base
path stays as it is (docs/architecture.md, "Multi-LoRA").

Adapters occupy slots (the wire's adapter_index - 1). Adapters loaded while serving (LoadAdapter) fill a
free slot or a new one; the stacks grow when needed (`update_delta`), and an unloaded slot is zeroed.

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

    @property
    def slots(self) -> int:
        return self.a.shape[0]

    @property
    def rank(self) -> int:
        return self.b.shape[1]

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
    """The delta of a linear fusing `parts` in `layer` for `adapters` in slots 0, 1, ...; None when no adapter
    targets any of them.

    split_inputs: the layer is row-parallel (parts are input columns; one part)."""
    delta = None
    for slot, adapter in enumerate(adapters):
        delta = update_delta(delta, len(adapters), slot, adapter, layer, parts, split_inputs=split_inputs, device=device)
    return delta


def _targets(adapter: LoraAdapter | None, layer: int, parts: Sequence[ProjectionPart]) -> bool:
    return adapter is not None and any((layer, p) in adapter.factors for p, _, _ in parts)


def update_delta(
    delta: LoraDelta | None, slots: int, slot: int, adapter: LoraAdapter | None, layer: int,
    parts: Sequence[ProjectionPart], *, split_inputs: bool, device: torch.device,
) -> LoraDelta | None:
    """`delta` once slot `slot` holds `adapter` (None: the slot is emptied), its stacks `slots` deep: every
    linear's stacks have one entry per slot, so a step's adapter groups index them all alike (a slot that
    does not target this linear, or is free, holds zeros). Grows the stacks (more slots, a larger rank) in
    a new delta; otherwise writes in place."""
    targets = _targets(adapter, layer, parts)
    if delta is None and not targets:
        return None
    rank = max(delta.rank if delta is not None else 0, adapter.rank if adapter is not None and targets else 0)
    if delta is None or delta.slots < slots or delta.rank < rank:
        delta = _grown(delta, slots, rank, adapter, layer, parts, split_inputs, device)
    with torch.no_grad():
        delta.a[slot].zero_()
        delta.b[slot].zero_()
        if adapter is not None and targets:
            _fill(delta, slot, adapter, layer, parts, split_inputs)
    return delta


def _grown(
    delta: LoraDelta | None, slots: int, rank: int, adapter: LoraAdapter | None, layer: int,
    parts: Sequence[ProjectionPart], split_inputs: bool, device: torch.device,
) -> LoraDelta:
    """Zeroed stacks of `slots` x `rank` holding `delta`'s factors (each projection's ranks re-padded)."""
    if delta is not None:
        in_features, bounds, dtype = delta.a.shape[1], list(delta.factors.bounds), delta.a.dtype
    else:
        assert adapter is not None  # update_delta creates a delta only for an adapter that targets it
        first = next(f for p, _, _ in parts if (f := adapter.factors.get((layer, p))))
        in_features = parts[0][2] - parts[0][1] if split_inputs else first.a.shape[1]
        outs = [first.b.shape[0] if split_inputs else stop - start for _, start, stop in parts]
        bounds, dtype = [sum(outs[:p]) for p in range(len(outs) + 1)], factor_dtype(first.a.dtype, device)
    a = torch.zeros(slots, in_features, len(parts) * rank, dtype=dtype, device=device)
    b = torch.zeros(slots, rank, bounds[-1], dtype=dtype, device=device)
    if delta is not None:
        old, kept = delta.rank, delta.slots
        for p in range(len(parts)):
            a[:kept, :, p * rank : p * rank + old] = delta.a[:, :, p * old : (p + 1) * old]
        b[:kept, :old] = delta.b
    return LoraDelta(a, b, bounds)


def _fill(delta: LoraDelta, slot: int, adapter: LoraAdapter, layer: int, parts: Sequence[ProjectionPart],
          split_inputs: bool) -> None:
    """Write `adapter`'s factors of `parts` into the (zeroed) slot, split as this rank holds the layer."""
    rank, bounds, dtype = delta.rank, delta.factors.bounds, delta.a.dtype
    for p, (projection, start, stop) in enumerate(parts):
        factors = adapter.factors.get((layer, projection))
        if factors is None:
            continue  # zeros: this adapter leaves the projection as it is
        r = adapter.rank
        fa = factors.a[:, start:stop] if split_inputs else factors.a  # [r, in_per_rank]
        fb = factors.b if split_inputs else factors.b[start:stop]  # [out_p, r]
        delta.a[slot, :, p * rank : p * rank + r] = fa.T.to(dtype)
        delta.b[slot, :r, bounds[p] : bounds[p + 1]] = (fb.float() * adapter.scaling).T.to(dtype)  # one rounding
