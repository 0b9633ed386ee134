"""Reference paged attention: the simplest correct code, float32 math, one sequence at a time.

It is the oracle the fast paths are tested against, so it reads only the plain batch description
in the metadata (lengths, block tables), never the precomputed plans the fast paths use.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tgictl.kernels.kv_pages import Pages, gather_rows
from tgictl.kernels.metadata import AttentionMetadata, check_attention_inputs


def _context(cache: Pages, table: tuple[int, ...], context_len: int) -> Tensor:
    """Positions 0 .. context_len - 1 of one sequence in float32 (int8 caches dequantized):
    [context_len, kv_heads, head_dim]."""
    block_size = cache.shape[1]
    positions = torch.arange(context_len)
    slots = torch.tensor(table, dtype=torch.int64)[positions // block_size] * block_size + positions % block_size
    return gather_rows(cache, slots.to(cache.device), torch.float32)


def attention_reference(
    query: Tensor,
    key_cache: Pages,
    value_cache: Pages,
    meta: AttentionMetadata,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> Tensor:
    """query: [num_tokens, heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim].
    window: a sliding window's positions (query at p sees keys p - window + 1 .. p), None for all.

    Returns [num_tokens, heads, head_dim] in query's dtype.
    """
    check_attention_inputs(query, key_cache, value_cache, meta)
    heads = query.shape[1]
    group = heads // key_cache.shape[2]  # query heads per KV head (GQA)
    out = torch.empty_like(query)
    start = 0
    for cache_len, new_len, table in zip(meta.cache_lens, meta.new_lens, meta.block_table_lists):
        context_len = cache_len + new_len
        # q: [heads, new_len, D]; k, v: [heads, context_len, D] (KV head h // group serves head h)
        q = query[start : start + new_len].float().transpose(0, 1)
        k = _context(key_cache, table, context_len).repeat_interleave(group, dim=1).transpose(0, 1)
        v = _context(value_cache, table, context_len).repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q @ k.transpose(1, 2) * scale  # [heads, new_len, context_len]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        query_pos = torch.arange(new_len)[:, None] + cache_len
        key_pos = torch.arange(context_len)[None, :]
        visible = key_pos <= query_pos  # [new_len, context_len]
        if window is not None:
            visible &= key_pos > query_pos - window
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start : start + new_len] = (probs @ v).transpose(0, 1).to(query.dtype)
        start += new_len
    return out
