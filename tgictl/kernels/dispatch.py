"""The one attention entry point the models call, and the registry of attention implementations.

`attention` splits a mixed batch by the metadata's precomputed plans: every decode row goes through
one batched kernel, each prefill sequence through the varlen-causal kernel. Other implementations
(the reference today; CUDA-specific kernels later) register under a name with the same signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

import torch
from torch import Tensor

from tgictl.errors import ConfigError
from tgictl.kernels.attention_fast import decode_attention, prefill_attention
from tgictl.kernels.attention_reference import attention_reference
from tgictl.kernels.kv_pages import Pages
from tgictl.kernels.metadata import AttentionMetadata, check_attention_inputs
from tgictl.kernels.window import windowed


class AttentionFn(Protocol):
    def __call__(
        self,
        query: Tensor,
        key_cache: Pages,
        value_cache: Pages,
        meta: AttentionMetadata,
        scale: float,
        softcap: float | None = None,
        window: int | None = None,
    ) -> Tensor: ...


def attention(
    query: Tensor,
    key_cache: Pages,
    value_cache: Pages,
    meta: AttentionMetadata,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> Tensor:
    """Paged causal attention for the new tokens of a (mixed) batch.

    query: [num_tokens, heads, head_dim], the new tokens of every sequence in batch order, whose
    K/V are already stored; caches: [num_blocks, block_size, kv_heads, head_dim] in their format
    (kernels/kv_pages.py). window: a sliding
    window's positions (a query sees itself and the window - 1 positions before it), None for all.
    Returns [num_tokens, heads, head_dim] in query's dtype.
    """
    check_attention_inputs(query, key_cache, value_cache, meta)
    meta = windowed(meta, window)
    decode = meta.decode
    if meta.is_decode_only and decode is not None:
        return decode_attention(query, key_cache, value_cache, decode, scale, softcap)
    out = torch.empty_like(query)
    if decode is not None:
        n = decode.seq_indices.shape[0]
        if decode.query_rows is None:  # decode rows lead the batch: plain slices, no gather
            out[:n] = decode_attention(query[:n], key_cache, value_cache, decode, scale, softcap)
        else:
            rows = decode.query_rows
            q = query.index_select(0, rows)
            out.index_copy_(0, rows, decode_attention(q, key_cache, value_cache, decode, scale, softcap))
    for plan in meta.prefill:
        rows_q = query[plan.query_start : plan.query_end]
        out[plan.query_start : plan.query_end] = prefill_attention(
            rows_q, key_cache, value_cache, plan, scale, softcap
        )
    return out


ATTENTION_BACKENDS: Mapping[str, AttentionFn] = MappingProxyType(
    {"torch": attention, "reference": attention_reference}
)
DEFAULT_ATTENTION_BACKEND = "torch"


def get_attention_backend(name: str = DEFAULT_ATTENTION_BACKEND) -> AttentionFn:
    """The implementation registered as `name`; an unknown name lists the known ones."""
    try:
        return ATTENTION_BACKENDS[name]
    except KeyError:
        known = ", ".join(sorted(ATTENTION_BACKENDS))
        raise ConfigError(f"unknown attention backend {name!r}; known: {known}") from None
