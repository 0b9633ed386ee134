"""Fast paged attention in plain torch: one batched call for all decode rows, one per prefill sequence.

Both kernels gather context K/V from the paged cache with the flat slot indices precomputed in the
metadata, then run torch's scaled_dot_product_attention in float32. Float32 is deliberate: softmax
must be float32 for numerics, and on CPU SDPA over upcast inputs measured ~2x faster than bf16 SDPA
and than hand-written matmul + softmax (scripts/bench_kernels.py). Softcapping (tanh on the logits)
is not expressible in SDPA, so it takes an explicit matmul path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tgictl.kernels.metadata import DecodePlan, PrefillPlan


def _flat(cache: Tensor) -> Tensor:
    # [num_blocks, block_size, kv_heads, head_dim] -> [num_slots, kv_heads, head_dim] (a view)
    return cache.view(-1, cache.shape[2], cache.shape[3])


def _softcapped(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float, softcap: float) -> Tensor:
    """Attention with logits = softcap * tanh(q.k * scale / softcap); bias is 0 / -inf (additive)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap + bias
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def decode_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    softcap: float | None = None,
) -> Tensor:
    """One new token per sequence, all sequences at once (no Python loop over the batch).

    query: [n, heads, head_dim], row i belonging to the plan's i-th decode sequence.
    Returns [n, heads, head_dim] in query's dtype.
    """
    n, heads, head_dim = query.shape
    kv_heads = key_cache.shape[2]
    group = heads // kv_heads
    t = plan.max_context_len
    # k, v: [n, kv_heads, T, head_dim] (gathered in cache dtype, then upcast: half the bytes moved)
    k = _flat(key_cache).index_select(0, plan.slots).float().view(n, t, kv_heads, head_dim).transpose(1, 2)
    v = _flat(value_cache).index_select(0, plan.slots).float().view(n, t, kv_heads, head_dim).transpose(1, 2)
    # GQA without copying K/V: the `group` query heads sharing a KV head become `group` query rows
    # of that head (one query position each, all with the same visible context).
    # q: [n, kv_heads, group, head_dim]
    q = query.float().view(n, kv_heads, group, head_dim)
    if softcap is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=plan.bias, scale=scale)
    else:
        out = _softcapped(q, k, v, plan.bias, scale, softcap)
    return out.reshape(n, heads, head_dim).to(query.dtype)


def prefill_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    plan: PrefillPlan,
    scale: float,
    softcap: float | None = None,
) -> Tensor:
    """Causal attention for one sequence's new tokens over its cached prefix plus themselves.

    query: [new_len, heads, head_dim]. Returns [new_len, heads, head_dim] in query's dtype.
    """
    new_len, heads, head_dim = query.shape
    group = heads // key_cache.shape[2]
    # k, v: [heads, context_len, head_dim]; KV head h serves query heads h*group .. (h+1)*group-1.
    # The copy for GQA is cheap next to prefill's L x T compute, and needs no torch>=2.5 enable_gqa.
    k = _flat(key_cache).index_select(0, plan.slots).float().transpose(0, 1)
    v = _flat(value_cache).index_select(0, plan.slots).float().transpose(0, 1)
    if group > 1:
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
    q = query.float().transpose(0, 1)  # [heads, new_len, head_dim]
    if softcap is None:
        # No prefix: SDPA's own causal mask is exact (query j at position j) and avoids a mask tensor.
        out = F.scaled_dot_product_attention(
            q[None], k[None], v[None], attn_mask=plan.mask, is_causal=plan.mask is None, scale=scale
        )[0]
    else:
        visible = plan.mask
        if visible is None:
            visible = torch.ones(new_len, new_len, dtype=torch.bool, device=query.device).tril()
        bias = torch.zeros(visible.shape, dtype=torch.float32, device=query.device).masked_fill(
            ~visible, float("-inf")
        )
        out = _softcapped(q, k, v, bias, scale, softcap)
    return out.transpose(0, 1).to(query.dtype)
