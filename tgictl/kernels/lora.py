"""Batched low-rank (LoRA) deltas for a batch whose rows use different adapters (or none).

A linear layer's output `y = x W^T` gains, for a token of adapter k, `(x A_k^T) B_k^T` per projection
(docs/architecture.md, "Multi-LoRA"). The adapters' factors are stacked once at load:

    a: [N, in, P * R]  the A^T of every projection a layer fuses (P of them: q|k|v, gate|up), rank
                       padded with zeros to R, concatenated on the last dim
    bs: per projection (first output column, B^T [N, R, out_p]) with the scaling folded in

`AdapterGroups` is one step's grouping of the tokens by adapter, built once per step and used by every
layer. Two ways compute the same sums:

- padded: tokens of each adapter in one padded group, one bmm for the A product of all groups and one
  per projection for B (few ops; the padding is computed too, so it is used when groups are even:
  decode, where every row is one token);
- segments: one pair of matmuls per adapter (no padding; prefill, where one row can be a long prompt).

Tokens without an adapter are in no group: their output is not touched at all. `add_lora_reference`
is the per-token loop both are tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# (first output column of the projection in y, B^T stacked over adapters [N, R, out_p])
ProjectionB = tuple[int, Tensor]

# Padding may add at most this many computed tokens per real one before segments are cheaper.
_MAX_PADDING_RATIO = 2


@dataclass(frozen=True)
class AdapterGroups:
    """The tokens of one forward grouped by adapter slot (0 .. N-1). Built by `group_tokens`."""

    num_adapters: int  # N: adapters loaded
    slots: tuple[int, ...]  # [G] adapter slots present, ascending
    tokens: tuple[tuple[int, ...], ...]  # [G] token indices of each slot
    padded: bool  # compute with one padded bmm (else one matmul pair per slot)
    slot_index: Tensor  # [G] int64, the slots
    gather: Tensor  # [G * S] int64 token of each padded position (padding: the group's first token)
    mask: Tensor  # [G, S, 1] float32: 1 at real tokens, 0 at padding
    segments: tuple[Tensor, ...]  # [G] int64 token indices per slot, for the segment path
    # [T] padded position of each token when every token has an adapter (None otherwise): the deltas
    # then reach their tokens by one gather and a plain add instead of a scatter-add (several times
    # slower on CPU).
    inverse: Tensor | None = None

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
    return AdapterGroups(
        num_adapters=num_adapters,
        slots=slots,
        tokens=tokens,
        padded=padded,
        slot_index=torch.tensor(slots, dtype=torch.int64, device=device),
        gather=torch.tensor(gather, dtype=torch.int64, device=device),
        mask=torch.tensor(mask, dtype=torch.float32, device=device).view(len(slots), longest, 1),
        segments=tuple(torch.tensor(t, dtype=torch.int64, device=device) for t in tokens),
        inverse=torch.tensor(inverse, dtype=torch.int64, device=device) if every else None,
    )


def add_lora(x: Tensor, y: Tensor, a: Tensor, bs: Sequence[ProjectionB], groups: AdapterGroups) -> Tensor:
    """y[t] += the LoRA delta of token t's adapter, in place; returns y. x: [T, in], y: [T, out].

    The projections of `bs` cover y's columns in order (q|k|v, gate|up, or one), so the deltas of all
    of them are one [tokens, out] tensor. The products run in the factors' dtype (float32 on CPU,
    where bf16 bmm at these small shapes is 3-4x slower); the delta is added in y's."""
    if groups.padded:
        return _add_padded(x, y, a, bs, groups)
    return _add_segments(x, y, a, bs, groups)


def _expand(shrunk: Tensor, bs: Sequence[ProjectionB], pick: Tensor | None) -> Tensor:
    """[..., P * R] -> [..., out]: each projection's B product, side by side."""
    parts = []
    for p, (_, b) in enumerate(bs):
        rank = b.shape[-2]  # b: [N, R, out_p] or one adapter's [R, out_p]
        b_used = b if pick is None else b.index_select(0, pick)
        parts.append(torch.matmul(shrunk[..., p * rank : (p + 1) * rank], b_used))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def _add_padded(x: Tensor, y: Tensor, a: Tensor, bs: Sequence[ProjectionB], groups: AdapterGroups) -> Tensor:
    count, longest = groups.mask.shape[0], groups.mask.shape[1]
    pick = None if groups.all_slots else groups.slot_index
    gathered = x.index_select(0, groups.gather).view(count, longest, x.shape[1]).to(a.dtype)  # [G, S, in]
    a_groups = a if pick is None else a.index_select(0, pick)  # [G, in, P * R]
    # Padding rows are zeroed here, so their B products are exact zeros.
    shrunk = torch.bmm(gathered, a_groups) * groups.mask.to(a.dtype)  # [G, S, P * R]
    delta = _expand(shrunk, bs, pick).view(count * longest, -1)  # [G * S, out]
    if groups.inverse is not None:  # every token has an adapter: gather its delta, add densely
        return y.add_(delta.index_select(0, groups.inverse))
    return y.index_add_(0, groups.gather, delta.to(y.dtype))


def _add_segments(x: Tensor, y: Tensor, a: Tensor, bs: Sequence[ProjectionB], groups: AdapterGroups) -> Tensor:
    for slot, index in zip(groups.slots, groups.segments):
        shrunk = x.index_select(0, index).to(a.dtype) @ a[slot]  # [n, P * R]
        delta = _expand(shrunk, [(first, b[slot]) for first, b in bs], None)  # [n, out]
        y.index_add_(0, index, delta.to(y.dtype))
    return y


def add_lora_reference(
    x: Tensor, y: Tensor, a: Tensor, bs: Sequence[ProjectionB], token_slots: Sequence[int]
) -> Tensor:
    """The definition, one token at a time (tests): y[t] += (x[t] A_k^T) B_k^T for its slot k."""
    for t, slot in enumerate(token_slots):
        if slot < 0:
            continue
        shrunk = x[t].to(a.dtype) @ a[slot]
        for p, (first, b) in enumerate(bs):
            rank = b.shape[1]
            y[t, first : first + b.shape[2]] += (shrunk[p * rank : (p + 1) * rank] @ b[slot]).to(y.dtype)
    return y


@dataclass(frozen=True)
class StepAdapters:
    """One forward's groupings: of every token (layers before the last, the last's q|k|v), and of the
    rows the LM head reads (the last layer's o projection and MLP run on those rows only)."""

    tokens: AdapterGroups
    logit_rows: AdapterGroups | None

    def for_rows(self, last_layer: bool) -> AdapterGroups | None:
        return self.logit_rows if last_layer else self.tokens
