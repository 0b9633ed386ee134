"""Fast paged attention: one batched call for all decode rows, one per prefill sequence.

On CPU, decode goes to the compiled kernel (kernels/native.py) when it is available; the torch
versions below serve everything else. Both torch kernels gather context K/V from the paged cache
with the flat slot indices precomputed in the metadata. Prefill runs torch's
scaled_dot_product_attention in float32 (softmax must be float32; for a 1,000-token prompt on CPU it
measured as fast as bf16 SDPA, with or without enable_gqa). Decode (one query row per sequence)
in torch uses batched matmuls in the model's dtype with a float32 softmax: at batch 32 and 256
cached tokens in bf16 that measured 0.9 ms per layer against 2.3 ms for upcast + SDPA, most of which was
the float32 copies of K and V (scripts/perf_decode.py). Softcapping (tanh on the logits) is not
expressible in SDPA, so prefill takes an explicit matmul path for it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tgictl.kernels.kv_pages import Int8Pages, Pages, gather_rows
from tgictl.kernels.metadata import DecodePlan, PrefillPlan
from tgictl.kernels.native import load_native_kernels, paged_decode_int8, prefill_attention_int8


def _softcapped(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float, softcap: float) -> Tensor:
    """Attention with logits = softcap * tanh(q.k * scale / softcap); bias is 0 / -inf (additive)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap + bias
    return torch.matmul(torch.softmax(scores, dim=-1), v)


# Up to this many KV heads, decode scores and outputs are computed as ONE dense batched matmul per
# sequence against a block-diagonal query (kv_heads-fold wasted FLOPs): SmolLM2 (3 KV heads, 3 query
# heads each) measured 0.36 ms against 0.79 ms for per-KV-head matmuls, whose 3-row products run far
# below the matmul kernels' speed. Many KV heads (MHA) would waste too much; they take per-head matmuls.
_BLOCK_DIAGONAL_MAX_KV_HEADS = 4


def _decode_scores(q: Tensor, k: Tensor) -> Tensor:
    """q: [n, kv_heads, group, d]; k: [n, T, kv_heads, d] (contiguous) -> raw q.k [n, heads, T]."""
    n, kv_heads, group, d = q.shape
    t = k.shape[1]
    if kv_heads == 1 or kv_heads > _BLOCK_DIAGONAL_MAX_KV_HEADS:
        # [n, kv_heads, group, d] @ [n, kv_heads, d, T]
        return torch.matmul(q, k.permute(0, 2, 3, 1)).view(n, kv_heads * group, t)
    # q_block: [n, kv_heads * d, heads]; column kv * group + j holds query head (kv, j) in rows of KV head kv
    q_block = q.new_zeros(n, kv_heads, d, kv_heads, group)
    torch.diagonal(q_block, dim1=1, dim2=3).copy_(q.permute(0, 3, 2, 1))  # [n, d, group, kv_heads] view
    scores = torch.bmm(k.view(n, t, kv_heads * d), q_block.view(n, kv_heads * d, kv_heads * group))
    return scores.transpose(1, 2)  # [n, heads, T]


def _decode_output(probs: Tensor, v: Tensor, group: int) -> Tensor:
    """probs: [n, heads, T]; v: [n, T, kv_heads, d] (contiguous) -> [n, heads, d]."""
    n, heads, t = probs.shape
    kv_heads, d = v.shape[2], v.shape[3]
    if kv_heads == 1 or kv_heads > _BLOCK_DIAGONAL_MAX_KV_HEADS:
        out = torch.matmul(probs.view(n, kv_heads, group, t), v.transpose(1, 2))  # [n, kv_heads, group, d]
        return out.reshape(n, heads, d)
    # every head against every KV head's values, then each head keeps its own KV head's block
    full = torch.bmm(probs, v.view(n, t, kv_heads * d)).view(n, kv_heads, group, kv_heads, d)
    own = torch.diagonal(full, dim1=1, dim2=3)  # [n, group, d, kv_heads]
    return own.permute(0, 3, 1, 2).reshape(n, heads, d)


def decode_attention(
    query: Tensor,
    key_cache: Pages,
    value_cache: Pages,
    plan: DecodePlan,
    scale: float,
    softcap: float | None = None,
) -> Tensor:
    """One new token per sequence, all sequences at once (no Python loop over the batch).

    query: [n, heads, head_dim], row i belonging to the plan's i-th decode sequence.
    Returns [n, heads, head_dim] in query's dtype.

    On CPU the compiled kernel (kernels/native.py) reads the paged cache in place, in float32
    arithmetic, when it is available; otherwise, or for dtypes it does not take, the torch ops.
    """
    if query.device.type == "cpu" and (native := load_native_kernels()) is not None:
        if isinstance(key_cache, Int8Pages) and isinstance(value_cache, Int8Pages):
            out = paged_decode_int8(native, query.contiguous(), key_cache, value_cache, plan.slots, plan.context_lens,
                                    plan.max_context_len, scale, softcap)
        else:
            out = native.paged_decode(query.contiguous(), key_cache, value_cache, plan.slots, plan.context_lens,
                                      plan.max_context_len, scale, softcap)
        if out is not None:
            return out
    return decode_attention_torch(query, key_cache, value_cache, plan, scale, softcap)


def decode_attention_torch(
    query: Tensor,
    key_cache: Pages,
    value_cache: Pages,
    plan: DecodePlan,
    scale: float,
    softcap: float | None = None,
) -> Tensor:
    """`decode_attention` in torch ops alone (any device and dtype): gather, then batched matmuls.

    The products run in the query's dtype (bf16 matmuls are about twice float32's speed on CPUs with
    AVX512-bf16, and torch's CPU SDPA is slow in bf16); only the scores' scaling, mask and softmax are
    float32, as transformers' eager attention does.
    """
    n, heads, head_dim = query.shape
    kv_heads = key_cache.shape[2]
    group = heads // kv_heads
    t = plan.max_context_len
    dtype = query.dtype
    # k, v: [n, T, kv_heads, head_dim], contiguous (padding rows gather the sequence's position 0)
    k = gather_rows(key_cache, plan.slots, dtype).view(n, t, kv_heads, head_dim)
    v = gather_rows(value_cache, plan.slots, dtype).view(n, t, kv_heads, head_dim)
    scores = _decode_scores(query.view(n, kv_heads, group, head_dim), k).float() * scale  # [n, heads, T]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    probs = torch.softmax(scores + plan.bias.view(n, 1, t), dim=-1).to(dtype)  # [n, heads, T]
    return _decode_output(probs, v, group)


def prefill_attention(
    query: Tensor,
    key_cache: Pages,
    value_cache: Pages,
    plan: PrefillPlan,
    scale: float,
    softcap: float | None = None,
) -> Tensor:
    """Causal attention for one sequence's new tokens over its cached prefix plus themselves.

    query: [new_len, heads, head_dim]. Returns [new_len, heads, head_dim] in query's dtype.

    bf16 on CPU takes a compiled kernel: csrc/prefill_attention_amx.c where the CPU has AMX (1.9 ms per layer
    for a 1,000-token prompt on 2 Xeon cores, SDPA 3.0-3.4), else csrc/prefill_attention_bf16.c where the build
    has AVX512-BF16: torch's CPU flash kernel multiplies bf16 through MKL, which widens to float32 on AMD CPUs
    (11.7 ms per layer for a 1,000-token prompt on 2 Zen 5 cores). An int8 cache takes the AVX512-BF16 kernel's
    int8 entry, which widens each row as it reads it (the torch path gathers and widens the whole prefix first).
    """
    if query.device.type == "cpu" and query.dtype == torch.bfloat16 and softcap is None \
            and (native := load_native_kernels()) is not None:
        if isinstance(key_cache, Int8Pages) and isinstance(value_cache, Int8Pages):
            out = prefill_attention_int8(native, query.contiguous(), key_cache, value_cache, plan.slots,
                                         plan.cache_len, scale, plan.window)
        else:
            out = native.prefill_attention(query.contiguous(), key_cache, value_cache, plan.slots, plan.cache_len,
                                           scale, plan.window)
        if out is not None:
            return out
    return prefill_attention_torch(query, key_cache, value_cache, plan, scale, softcap)


def prefill_attention_torch(
    query: Tensor,
    key_cache: Pages,
    value_cache: Pages,
    plan: PrefillPlan,
    scale: float,
    softcap: float | None = None,
) -> Tensor:
    """`prefill_attention` in torch ops alone (any device and dtype): gather, then SDPA."""
    new_len, heads, head_dim = query.shape
    group = heads // key_cache.shape[2]
    # SDPA in bf16 for bf16 models (what transformers' sdpa attention runs; on CPU torch's flash kernel
    # keeps float32 sums and softmax inside): a 1,000-token causal prompt, 9 heads of 64, takes 9 ms per
    # layer against 18 in float32. Other dtypes (float32: the exactness path, float16) compute in float32.
    dtype = torch.bfloat16 if query.dtype == torch.bfloat16 and softcap is None else torch.float32
    # k, v: [heads, context_len, head_dim]; KV head h serves query heads h*group .. (h+1)*group-1.
    # The copy for GQA is cheap next to prefill's L x T compute, and needs no torch>=2.5 enable_gqa.
    k = gather_rows(key_cache, plan.slots, dtype).transpose(0, 1)
    v = gather_rows(value_cache, plan.slots, dtype).transpose(0, 1)
    if group > 1:
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
    q = query.to(dtype).transpose(0, 1)  # [heads, new_len, head_dim]
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
