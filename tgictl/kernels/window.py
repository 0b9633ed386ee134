"""Sliding-window attention as plans: a batch as a layer that attends only its last `window` positions
sees it (Mistral, Phi-3, Gemma's and SmolLM3's local layers).

A query at position p sees the keys at p - window + 1 .. p: `window` keys, itself included (transformers'
`sliding_window_overlay`: kv_idx > q_idx - window). Every position's K/V stays in the paged cache (which
blocks the router may free is the allocator's business); only what each query reads changes.

- A decode row's visible keys are one contiguous run of positions, so its windowed plan gathers only those
  slots (the last min(context, window) positions): the decode kernels, compiled or torch, run unchanged on
  a shorter context, and a speculative row's drafts (each a decode sequence of its own) are windowed alike.
- A prefill's queries each start at their own position - window + 1. The windowed plan keeps the slots from
  the first query's start on, a mask with both bounds (the torch path) and `window` (the compiled kernel).

`windowed` builds the view once per window and batch (cached on the metadata, shared by every layer with that
window); a batch whose every context fits in the window is its own view.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from tgictl.errors import InvalidRequestError
from tgictl.kernels.metadata import AttentionMetadata, DecodePlan, PrefillPlan, as_tensor, padded_tables, slot_matrix


def windowed(meta: AttentionMetadata, window: int | None) -> AttentionMetadata:
    """`meta` as a layer with a sliding window of `window` positions sees it (None: full attention)."""
    if window is None or meta.max_context_len <= window:
        return meta
    if window < 1:
        raise InvalidRequestError(f"a sliding window must hold at least one position, got {window}")
    view = meta.window_views.get(window)
    if view is None:
        decode = None if meta.decode is None else _windowed_decode(meta, meta.decode, window)
        prefill = tuple(_windowed_prefill(plan, window) for plan in meta.prefill)
        view = dataclasses.replace(meta, decode=decode, prefill=prefill)
        meta.window_views[window] = view
    return view


def _windowed_decode(meta: AttentionMetadata, plan: DecodePlan, window: int) -> DecodePlan:
    """The decode rows' last min(context, window) positions; padding gathers the row's first visible slot
    (always written, so finite) and is masked by the shorter context_lens, as in the full plan."""
    rows = [i for i, n in enumerate(meta.new_lens) if n == 1]  # the plan's rows, in its order
    contexts = np.array([meta.cache_lens[i] + 1 for i in rows], dtype=np.int64)
    lens = np.minimum(contexts, window)
    starts = contexts - lens
    longest = int(lens.max())
    offsets = np.arange(longest, dtype=np.int64)[None, :]
    positions = np.where(offsets < lens[:, None], starts[:, None] + offsets, starts[:, None])
    tables = padded_tables([meta.block_table_lists[i] for i in rows])
    slots = slot_matrix(tables, positions, meta.block_size)
    return DecodePlan(
        seq_indices=plan.seq_indices,
        query_rows=plan.query_rows,
        context_lens=as_tensor(lens, meta.device),
        slots=as_tensor(slots.reshape(-1), meta.device),
        max_context_len=longest,
    )


def _windowed_prefill(plan: PrefillPlan, window: int) -> PrefillPlan:
    """The keys from the first query's window on, and the mask of both bounds."""
    new_len = plan.query_end - plan.query_start
    context = plan.cache_len + new_len
    if context <= window:
        return plan
    first = max(0, plan.cache_len - window + 1)  # the first key the first query sees
    query_pos = np.arange(new_len, dtype=np.int64)[:, None] + plan.cache_len
    key_pos = np.arange(first, context, dtype=np.int64)[None, :]
    visible = (key_pos <= query_pos) & (key_pos > query_pos - window)
    return PrefillPlan(
        seq_index=plan.seq_index,
        query_start=plan.query_start,
        query_end=plan.query_end,
        cache_len=plan.cache_len - first,
        slots=plan.slots[first:],
        mask=torch.from_numpy(visible).to(plan.slots.device),
        window=window,
    )
