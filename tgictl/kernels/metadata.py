"""Attention metadata: everything about a batch's layout that every layer shares.

A forward pass builds one `AttentionMetadata` and hands it to all layers, so any index or mask the
kernels need is computed here once instead of once per layer (a decode step calls attention once
per layer with identical metadata).

Batch layout (a MIXED batch): sequence i has `cache_lens[i]` tokens whose K/V are already in the
paged cache and `new_lens[i]` new tokens, whose K/V the model writes with `store_kv` BEFORE calling
attention (at positions cache_len .. cache_len + new_len - 1). Query rows are the new tokens of every
sequence concatenated in batch order; new token j of sequence i sees positions 0 .. cache_len + j (a
sliding-window layer sees the metadata's windowed view instead: kernels/window.py).
A decode sequence is simply one with new_len == 1.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np
import torch
from torch import Tensor

from tgictl.errors import InvalidRequestError, UnsupportedModelError
from tgictl.kernels.kv_pages import Pages


@dataclass(frozen=True, eq=False)
class DecodePlan:
    """Precomputed gather for the decode rows (sequences with new_len == 1), padded to one length.

    Padded context positions gather the sequence's own position 0 (always written, so finite) and
    are removed by `bias`; pointing them at an arbitrary slot could read NaN from never-written
    cache memory, and 0 * NaN in probs @ V would poison the row even though its weight is 0.
    """

    seq_indices: Tensor  # [n_decode] int64: which sequences of the batch are decode rows
    query_rows: Tensor | None  # [n_decode] int64 rows of `query`; None when they are 0..n-1 in order
    context_lens: Tensor  # [n_decode] int64
    slots: Tensor  # [n_decode * max_context_len] int64 flat slots, row-major over [n_decode, T]
    max_context_len: int  # T

    @functools.cached_property
    def bias(self) -> Tensor:
        """[n_decode, 1, 1, T] float32: 0 where visible, -inf on padding. Built on first use: only the torch
        attention reads it, and a decode step's metadata is rebuilt every step."""
        positions = torch.arange(self.max_context_len, dtype=torch.int64, device=self.context_lens.device)
        bias = torch.zeros(len(self.context_lens), self.max_context_len, dtype=torch.float32,
                           device=self.context_lens.device)
        bias.masked_fill_(positions >= self.context_lens[:, None], float("-inf"))
        return bias.view(len(self.context_lens), 1, 1, self.max_context_len)


@dataclass(frozen=True, eq=False)
class PrefillPlan:
    """One sequence with new_len > 1 (a prompt or a prompt chunk, possibly after a cached prefix)."""

    seq_index: int
    query_start: int  # rows query_start .. query_end - 1 of `query`
    query_end: int
    cache_len: int  # keys in `slots` before the first query's own (the cached prefix, or its windowed tail)
    slots: Tensor  # [cache_len + new_len] int64 flat slots of the keys, in position order
    # [new_len, cache_len + new_len] bool, True = visible; None when plain causal suffices (no prefix, no window).
    mask: Tensor | None
    # Sliding window (kernels/window.py): query j sees only keys after cache_len + j - window; None: all before it.
    window: int | None = None


@dataclass(frozen=True, eq=False)
class AttentionMetadata:
    block_size: int
    cache_lens: tuple[int, ...]  # [batch] tokens already cached per sequence
    new_lens: tuple[int, ...]  # [batch] new tokens (query rows) per sequence
    block_table_lists: tuple[tuple[int, ...], ...]  # [batch][blocks] as given (for the reference)
    num_tokens: int  # sum(new_lens): rows of `query`
    max_context_len: int
    max_block_id: int  # largest block id in any table: checked against the cache without a device sync
    device: torch.device  # where every tensor of the metadata lives
    context_lens: Tensor  # [batch] int64 cache_len + new_len
    is_decode_only: bool  # every sequence has new_len == 1
    decode: DecodePlan | None  # None when the batch has no decode rows
    prefill: tuple[PrefillPlan, ...]  # sequences with new_len > 1, in batch order
    # This batch as sliding-window layers see it, per window (kernels/window.py builds and keeps them).
    window_views: dict[int, AttentionMetadata] = field(default_factory=dict, init=False, repr=False)

    # The tensors below describe the batch for varlen kernels and the tests; no kernel of a decode step reads
    # them (positions and slots come with the step's inputs), so they are built on first use, not per step.

    @functools.cached_property
    def cu_seqlens_q(self) -> Tensor:
        """[batch + 1] int64 query row offsets."""
        return as_tensor([0, *accumulate(self.new_lens)], self.device)

    @functools.cached_property
    def cu_seqlens_k(self) -> Tensor:
        """[batch + 1] int64 offsets of each sequence's whole context."""
        return as_tensor([0, *accumulate(c + n for c, n in zip(self.cache_lens, self.new_lens))], self.device)

    @functools.cached_property
    def position_ids(self) -> Tensor:
        """[num_tokens] int64 absolute position of each query row (cache_len + j)."""
        return as_tensor([c + j for c, n in zip(self.cache_lens, self.new_lens) for j in range(n)], self.device)

    @functools.cached_property
    def new_token_slots(self) -> Tensor:
        """[num_tokens] int64 slot of each new token from the block tables (block * block_size + offset), where
        store_kv writes it; equals the router's slots, which follow the same rule."""
        size = self.block_size
        return as_tensor([table[p // size] * size + p % size
                        for table, c, n in zip(self.block_table_lists, self.cache_lens, self.new_lens)
                        for p in range(c, c + n)], self.device)

    @functools.cached_property
    def block_tables(self) -> Tensor:
        """[batch, max_blocks] int64, padded with block 0."""
        return as_tensor(padded_tables(self.block_table_lists), self.device)

    @property
    def batch_size(self) -> int:
        return len(self.new_lens)

    @classmethod
    def build(
        cls,
        cache_lens: Sequence[int],
        new_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        device: torch.device | str,
    ) -> AttentionMetadata:
        return build_attention_metadata(
            list(cache_lens), list(new_lens), [list(t) for t in block_tables], block_size, device
        )


def _check(
    cache_lens: list[int], new_lens: list[int], block_tables: list[list[int]], block_size: int
) -> None:
    if block_size < 1:
        raise InvalidRequestError(f"block_size must be >= 1, got {block_size}")
    if not (len(cache_lens) == len(new_lens) == len(block_tables)):
        raise InvalidRequestError(
            f"cache_lens ({len(cache_lens)}), new_lens ({len(new_lens)}) and block_tables "
            f"({len(block_tables)}) must have one entry per sequence"
        )
    if not new_lens:
        raise InvalidRequestError("an attention batch needs at least one sequence")
    for i, (cache_len, new_len, table) in enumerate(zip(cache_lens, new_lens, block_tables)):
        if cache_len < 0 or new_len < 1:
            raise InvalidRequestError(
                f"sequence {i}: cache_len must be >= 0 and new_len >= 1, got {cache_len} and {new_len}"
            )
        if cache_len + new_len > len(table) * block_size:
            raise InvalidRequestError(
                f"sequence {i}: context of {cache_len + new_len} tokens needs more than the "
                f"{len(table)} blocks of {block_size} in its block table"
            )
        if min(table) < 0:  # not empty: checked above
            raise InvalidRequestError(f"sequence {i}: block ids must be >= 0")


def slot_matrix(tables: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Flat slots of `positions` for each row of `tables`: slot = block * block_size + offset.

    tables: [rows, max_blocks] int64; positions: [rows, T] or [1, T] (the same for every row) int64 -> [rows, T]
    int64. Plain indexing: numpy's take_along_axis and broadcast_to are Python functions, slow with cold caches.
    """
    rows = np.arange(tables.shape[0])[:, None]
    return tables[rows, positions // block_size] * block_size + positions % block_size


def as_tensor(array: np.ndarray | list[int], device: torch.device) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device)


def padded_tables(block_tables: Sequence[Sequence[int]]) -> np.ndarray:
    """[batch, max_blocks] int64, padded with block 0."""
    tables = np.zeros((len(block_tables), max(len(t) for t in block_tables)), dtype=np.int64)
    for i, table in enumerate(block_tables):
        tables[i, : len(table)] = table
    return tables


def build_attention_metadata(
    cache_lens: list[int],
    new_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str,
) -> AttentionMetadata:
    """Validate the batch layout and precompute every gather index and mask the kernels use."""
    _check(cache_lens, new_lens, block_tables, block_size)
    device = torch.device(device)
    context_lens = [c + n for c, n in zip(cache_lens, new_lens)]
    cu = [0, *accumulate(new_lens)]  # query row offsets

    # Index math runs vectorised in numpy (no per-token Python), then each result becomes a tensor on `device`
    # once. A decode step rebuilds this every step, after the weights' stream has left the caches cold: as
    # ~20 torch calls on CPU tensors it took 0.19-0.24 ms of a 4.2 ms one-row GGUF step (Zen 5), a numpy call
    # costing a fraction of a torch one.
    tables = padded_tables(block_tables)
    decode_seqs = [i for i, n in enumerate(new_lens) if n == 1]
    decode_only = len(decode_seqs) == len(new_lens)
    decode: DecodePlan | None = None
    if decode_seqs:
        dec_lens = [context_lens[i] for i in decode_seqs]
        dec_ctx = np.array(dec_lens, dtype=np.int64)  # [n]
        max_ctx = max(dec_lens)
        positions = np.arange(max_ctx, dtype=np.int64)[None, :]  # the same for every row
        if min(dec_lens) < max_ctx:
            # padding gathers position 0 of the same sequence (see DecodePlan)
            positions = np.where(positions < dec_ctx[:, None], positions, 0)
        slots = slot_matrix(tables if decode_only else tables[decode_seqs], positions, block_size)
        rows = [cu[i] for i in decode_seqs]
        in_order = rows == list(range(len(rows)))
        decode = DecodePlan(
            seq_indices=as_tensor(decode_seqs, device),
            query_rows=None if in_order else as_tensor(rows, device),
            context_lens=as_tensor(dec_ctx, device),
            slots=as_tensor(slots.reshape(-1), device),
            max_context_len=max_ctx,
        )

    prefill: list[PrefillPlan] = []
    for i, (cache_len, new_len) in enumerate(zip(cache_lens, new_lens)):
        if new_len == 1:
            continue
        key_pos = np.arange(cache_len + new_len, dtype=np.int64)  # [context_len]
        mask = None
        if cache_len > 0:
            # query j sits at absolute position cache_len + j and sees key positions <= it
            query_pos = np.arange(new_len, dtype=np.int64) + cache_len
            mask = torch.from_numpy(key_pos[None, :] <= query_pos[:, None]).to(device)
        prefill.append(
            PrefillPlan(
                seq_index=i,
                query_start=cu[i],
                query_end=cu[i + 1],
                cache_len=cache_len,
                slots=as_tensor(slot_matrix(tables[i : i + 1], key_pos[None, :], block_size)[0], device),
                mask=mask,
            )
        )

    return AttentionMetadata(
        block_size=block_size,
        cache_lens=tuple(cache_lens),
        new_lens=tuple(new_lens),
        block_table_lists=tuple(tuple(t) for t in block_tables),
        num_tokens=cu[-1],
        max_context_len=max(context_lens),
        max_block_id=max(max(t) for t in block_tables),
        device=device,
        # a decode-only batch's context lengths are its decode plan's
        context_lens=decode.context_lens if decode_only and decode is not None else as_tensor(context_lens, device),
        is_decode_only=decode_only,
        decode=decode,
        prefill=tuple(prefill),
    )


def check_attention_inputs(
    query: Tensor, key_cache: Pages, value_cache: Pages, meta: AttentionMetadata
) -> None:
    """Cheap shape checks shared by every attention implementation (no device sync)."""
    if query.dim() != 3 or key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise InvalidRequestError(
            f"attention expects query [tokens, heads, head_dim] and equal caches "
            f"[blocks, block_size, kv_heads, head_dim], got {tuple(query.shape)}, "
            f"{tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    if query.shape[0] != meta.num_tokens:
        raise InvalidRequestError(
            f"query has {query.shape[0]} rows but the metadata describes {meta.num_tokens}"
        )
    if key_cache.shape[1] != meta.block_size:
        raise InvalidRequestError(
            f"cache block_size {key_cache.shape[1]} != metadata block_size {meta.block_size}"
        )
    if meta.context_lens.device != query.device:  # a tensor's device: "cuda" and "cuda:0" differ as names
        raise InvalidRequestError(
            f"attention metadata lives on {meta.context_lens.device} but the query on {query.device}"
        )
    if meta.max_block_id >= key_cache.shape[0]:
        raise InvalidRequestError(
            f"block id {meta.max_block_id} is out of range for a cache of {key_cache.shape[0]} blocks"
        )
    if query.shape[2] != key_cache.shape[3]:
        raise InvalidRequestError(f"query head_dim {query.shape[2]} != cache head_dim {key_cache.shape[3]}")
    if query.shape[1] % key_cache.shape[2] != 0:
        raise UnsupportedModelError(
            f"attention heads ({query.shape[1]}) must be a multiple of kv_heads ({key_cache.shape[2]})"
        )
