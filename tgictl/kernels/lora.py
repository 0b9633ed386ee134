"""Batched low-rank (LoRA) deltas for a batch whose rows use different adapters (or none).

A linear layer's output `y = x W^T` gains, for a token of adapter k, `(x A_k^T) B_k^T` per projection
(docs/architecture.md, "Multi-LoRA"). The adapters' factors are stacked once at load (`LoraFactors`):

    a: [N, in, P * R]  the A^T of every projection a layer fuses (P of them: q|k|v, gate|up), rank
                       padded with zeros to R, concatenated on the last dim
    b: [N, R, out]     the B^T of every projection (scaling folded in), side by side on the last dim
                       as their outputs are in y (projection p at columns bounds[p] .. bounds[p + 1])

`AdapterGroups` is one step's grouping of the tokens by adapter, built once per step and used by every
layer. Three ways compute the same sums:

- native (CPU): one compiled call per linear (csrc/lora.c), the tokens of an adapter sharing each read
  of its factors;
- padded: tokens of each adapter in one padded group, one bmm for the A product of all groups and one
  per projection for B (few ops; the padding is computed too, so it is used when groups are even:
  decode, where every row is one token);
- segments: one pair of matmuls per adapter (no padding; prefill, where one row can be a long prompt).

Tokens without an adapter are in no group: their output is not touched at all. `add_lora_reference`
is the per-token loop all three are tested against.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tgictl.kernels.native import load_native_kernels

# Padding may add at most this many computed tokens per real one before segments are cheaper.
_MAX_PADDING_RATIO = 2
# Tokens of one adapter the native kernel computes together: they share each read of the factors;
# a long prefill splits into chunks so both threads work on it.
_NATIVE_CHUNK = 16
_NATIVE_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class LoraFactors:
    """One linear's factors for every loaded adapter (shapes in the module docstring)."""

    a: Tensor  # [N, in, P * R]
    b: Tensor  # [N, R, out]
    bounds: tuple[int, ...]  # [P + 1] first output column of each projection, then out

    @property
    def rank(self) -> int:
        return self.b.shape[1]

    @property
    def native_arguments(self) -> tuple[int, ...] | None:
        """(a, b, bf16, rank, projections, bounds) for csrc/lora.c; None when it cannot take them.
        Not cached: the factors are a module's parameters, which `.to()` may move."""
        a, b = self.a, self.b
        if a.dtype not in _NATIVE_DTYPES or b.dtype != a.dtype or a.device.type != "cpu" \
                or b.device.type != "cpu" or not a.is_contiguous() or not b.is_contiguous():
            return None
        return (a.data_ptr(), b.data_ptr(), int(a.dtype == torch.bfloat16), self.rank, len(self.bounds) - 1,
                self.bounds_tensor.data_ptr())

    @functools.cached_property
    def bounds_tensor(self) -> Tensor:
        return torch.tensor(self.bounds, dtype=torch.int64)

    def projection_b(self, p: int) -> Tensor:
        """B^T of projection p for every adapter: [N, R, out_p] (a view)."""
        return self.b[:, :, self.bounds[p] : self.bounds[p + 1]]


@dataclass(frozen=True)
class AdapterGroups:
    """The tokens of one forward grouped by adapter slot (0 .. N-1). Built by `group_tokens`."""

    num_adapters: int  # N: adapters loaded
    slots: tuple[int, ...]  # [G] adapter slots present, ascending
    tokens: tuple[tuple[int, ...], ...]  # [G] token indices of each slot
    padded: bool  # compute with one padded bmm (else one matmul pair per slot)
    # The native path's work: every adapter token's index grouped by slot ([A] int64), and chunks of
    # it ([C, 3] int64 slot, start, stop; one slot, at most _NATIVE_CHUNK tokens each).
    order: Tensor
    chunks: Tensor
    slot_index: Tensor  # [G] int64, the slots
    gather: Tensor  # [G * S] int64 token of each padded position (padding: the group's first token)
    mask: Tensor  # [G, S, 1] float32: 1 at real tokens, 0 at padding
    segments: tuple[Tensor, ...]  # [G] int64 token indices per slot, for the segment path
    # [T] padded position of each token when every token has an adapter (None otherwise): the deltas
    # then reach their tokens by one gather and a plain add instead of a scatter-add (several times
    # slower on CPU).
    inverse: Tensor | None = None

    @functools.cached_property
    def native_arguments(self) -> tuple[int, ...] | None:
        """(order, chunks, chunk count, tokens per chunk at most) for csrc/lora.c; None off the CPU."""
        if self.order.device.type != "cpu":
            return None
        return (self.order.data_ptr(), self.chunks.data_ptr(), self.chunks.shape[0], _NATIVE_CHUNK)

    @property
    def all_slots(self) -> bool:
        """Every loaded adapter is present, in order: the stacks are used without a gather."""
        return len(self.slots) == self.num_adapters

    def select(self, rows: Sequence[int], device: torch.device) -> AdapterGroups | None:
        """The grouping of the tokens at `rows` (renumbered 0 .. len(rows) - 1)."""
        slot_of = {t: slot for slot, tokens in zip(self.slots, self.tokens) for t in tokens}
        return group_tokens([slot_of.get(t, -1) for t in rows], self.num_adapters, device)


def group_tokens(token_slots: Sequence[int], num_adapters: int, device: torch.device) -> AdapterGroups | None:
    """token_slots: [T] each token's adapter slot, -1 for none. None when no token has an adapter."""
    members: dict[int, list[int]] = {}
    for t, slot in enumerate(token_slots):
        if slot >= 0:
            members.setdefault(slot, []).append(t)
    if not members:
        return None
    slots = tuple(sorted(members))
    tokens = tuple(tuple(members[s]) for s in slots)
    longest = max(len(t) for t in tokens)
    real = sum(len(t) for t in tokens)
    padded = len(slots) * longest <= _MAX_PADDING_RATIO * real
    gather: list[int] = []
    mask: list[float] = []
    inverse = [0] * len(token_slots)
    for group in tokens:
        pad = longest - len(group)
        for t in group:
            inverse[t] = len(gather)
            gather.append(t)
        gather += [group[0]] * pad
        mask += [1.0] * len(group) + [0.0] * pad
    every = real == len(token_slots)
    chunks = [
        (slot, start + offset, start + min(offset + _NATIVE_CHUNK, len(group)))
        for slot, group, start in zip(slots, tokens, itertools.accumulate((len(g) for g in tokens), initial=0))
        for offset in range(0, len(group), _NATIVE_CHUNK)
    ]
    return AdapterGroups(
        num_adapters=num_adapters,
        slots=slots,
        tokens=tokens,
        padded=padded,
        order=torch.tensor([t for group in tokens for t in group], dtype=torch.int64, device=device),
        chunks=torch.tensor(chunks, dtype=torch.int64, device=device),
        slot_index=torch.tensor(slots, dtype=torch.int64, device=device),
        gather=torch.tensor(gather, dtype=torch.int64, device=device),
        mask=torch.tensor(mask, dtype=torch.float32, device=device).view(len(slots), longest, 1),
        segments=tuple(torch.tensor(t, dtype=torch.int64, device=device) for t in tokens),
        inverse=torch.tensor(inverse, dtype=torch.int64, device=device) if every else None,
    )


def add_lora(x: Tensor, y: Tensor, factors: LoraFactors, groups: AdapterGroups, native: bool = True) -> Tensor:
    """y[t] += the LoRA delta of token t's adapter, in place; returns y. x: [T, in], y: [T, out].

    The products run in the factors' dtype (float32 on CPU, where bf16 bmm at these small shapes is
    3-4x slower); the delta is added in y's. native=False: the torch paths (tests compare them)."""
    if native and _add_native(x, y, factors, groups):
        return y
    if groups.padded:
        return _add_padded(x, y, factors, groups)
    return _add_segments(x, y, factors, groups)


@functools.cache
def _native_entry() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    kernels = load_native_kernels()
    if kernels is None:
        return None
    p, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    fn = kernels.library.tgictl_lora_add
    fn.argtypes = [p, c_int, p, c_int, p, p, i64, i64, i64, i64, p, p, c_int, i64, i64, p, c_int]
    fn.restype = c_int
    return fn


def _add_native(x: Tensor, y: Tensor, factors: LoraFactors, groups: AdapterGroups) -> bool:
    """The compiled call (csrc/lora.c); False when it cannot run here (the caller uses torch).

    Called for every adapted linear of every step (120 times a step on SmolLM2): what can be checked
    once per factors or per step's grouping is (`native_arguments`), and only x and y here."""
    factor_args, group_args = factors.native_arguments, groups.native_arguments
    if factor_args is None or group_args is None or x.dtype not in _NATIVE_DTYPES or y.dtype not in _NATIVE_DTYPES \
            or x.device.type != "cpu" or y.device.type != "cpu" or not x.is_contiguous() or not y.is_contiguous() \
            or x.dim() != 2 or y.dim() != 2:
        return False
    fn = _native_entry()
    if fn is None:
        return False
    status = fn(x.data_ptr(), x.dtype == torch.bfloat16, y.data_ptr(), y.dtype == torch.bfloat16, *group_args,
                x.shape[1], y.shape[1], *factor_args, torch.get_num_threads())
    return status == 0


def _expand(shrunk: Tensor, factors: LoraFactors, pick: Tensor | None, slot: int | None = None) -> Tensor:
    """[..., P * R] -> [..., out]: each projection's B product, side by side."""
    parts = []
    rank = factors.rank
    for p in range(len(factors.bounds) - 1):
        b = factors.projection_b(p)  # [N, R, out_p]
        b_used = b[slot] if slot is not None else (b if pick is None else b.index_select(0, pick))
        parts.append(torch.matmul(shrunk[..., p * rank : (p + 1) * rank], b_used))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def _add_padded(x: Tensor, y: Tensor, factors: LoraFactors, groups: AdapterGroups) -> Tensor:
    a = factors.a
    count, longest = groups.mask.shape[0], groups.mask.shape[1]
    pick = None if groups.all_slots else groups.slot_index
    gathered = x.index_select(0, groups.gather).view(count, longest, x.shape[1]).to(a.dtype)  # [G, S, in]
    a_groups = a if pick is None else a.index_select(0, pick)  # [G, in, P * R]
    # Padding rows are zeroed here, so their B products are exact zeros.
    shrunk = torch.bmm(gathered, a_groups) * groups.mask.to(a.dtype)  # [G, S, P * R]
    delta = _expand(shrunk, factors, pick).view(count * longest, -1)  # [G * S, out]
    if groups.inverse is not None:  # every token has an adapter: gather its delta, add densely
        return y.add_(delta.index_select(0, groups.inverse))
    return y.index_add_(0, groups.gather, delta.to(y.dtype))


def _add_segments(x: Tensor, y: Tensor, factors: LoraFactors, groups: AdapterGroups) -> Tensor:
    for slot, index in zip(groups.slots, groups.segments):
        shrunk = x.index_select(0, index).to(factors.a.dtype) @ factors.a[slot]  # [n, P * R]
        delta = _expand(shrunk, factors, None, slot)  # [n, out]
        y.index_add_(0, index, delta.to(y.dtype))
    return y


def add_lora_reference(x: Tensor, y: Tensor, factors: LoraFactors, token_slots: Sequence[int]) -> Tensor:
    """The definition, one token at a time (tests): y[t] += (x[t] A_k^T) B_k^T for its slot k."""
    rank = factors.rank
    for t, slot in enumerate(token_slots):
        if slot < 0:
            continue
        shrunk = x[t].to(factors.a.dtype) @ factors.a[slot]
        for p in range(len(factors.bounds) - 1):
            first, stop = factors.bounds[p], factors.bounds[p + 1]
            y[t, first:stop] += (shrunk[p * rank : (p + 1) * rank] @ factors.projection_b(p)[slot]).to(y.dtype)
    return y


@dataclass(frozen=True)
class StepAdapters:
    """One forward's groupings: of every token (layers before the last, the last's q|k|v), and of the
    rows the LM head reads (the last layer's o projection and MLP run on those rows only)."""

    tokens: AdapterGroups
    logit_rows: AdapterGroups | None

    def for_rows(self, last_layer: bool) -> AdapterGroups | None:
        return self.logit_rows if last_layer else self.tokens
