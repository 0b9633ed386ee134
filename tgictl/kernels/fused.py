"""The decoder's elementwise steps as one compiled call each (csrc/fused_layers.c), and the greedy choice.

Why: at decode batch sizes the layers' elementwise work is small, and as torch ops it is dozens of
dispatches per layer (casts, pow, mean, rsqrt, muls, chunk, cat, index_copy_) that cost more than
the matmuls (docs/architecture.md, "Decode step"). Each function here runs one group natively with
the same arithmetic and roundings, or returns None when it cannot (another device or dtype, a
non-contiguous input, no compiler, TGICTL_NATIVE_KERNELS=0): the caller then runs its torch ops,
which stay the reference the tests hold these to.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tgictl.errors import InvalidRequestError
from tgictl.kernels.kv_pages import Int8Pages, Pages
from tgictl.kernels.native import NativeKernels, load_native_kernels

_NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def _native_for(*tensors: Tensor, dtypes: tuple[torch.dtype, ...] = _NATIVE_DTYPES) -> NativeKernels | None:
    """The kernels when every tensor is a contiguous CPU tensor of one dtype among `dtypes`."""
    dtype = tensors[0].dtype
    if dtype not in dtypes:
        return None
    for t in tensors:
        if t.device.type != "cpu" or t.dtype != dtype or not t.is_contiguous():
            return None
    return load_native_kernels()


def _bf16(dtype: torch.dtype) -> bool:
    return dtype == torch.bfloat16


def rms_norm(x: Tensor, weight: Tensor, eps: float, delta: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
    """(s, rmsnorm(s) * weight) with s = x + delta (rounded to x's dtype), or s = x without delta.

    x, delta: [..., dim]; weight: [dim]. None when it cannot run natively.

    bf16 only: in float32, the oracle dtype, the norm must equal transformers' bit for bit, and the
    statistics' float32 sum differs from torch's in its last bit about half the time (torch's
    reduction order is its own); in bf16 the result rounds to the same values.
    """
    parts = (x, weight) if delta is None else (x, weight, delta)
    native = _native_for(*parts, dtypes=(torch.bfloat16,))
    dim = weight.shape[0]
    if native is None or x.shape[-1] != dim or (delta is not None and delta.shape != x.shape):
        return None
    rows = x.numel() // dim
    out = torch.empty_like(x)
    total = x if delta is None else torch.empty_like(x)
    delta_ptr, total_ptr = (None, None) if delta is None else (delta.data_ptr(), total.data_ptr())
    native.rmsnorm_bf16(x.data_ptr(), delta_ptr, total_ptr, weight.data_ptr(), out.data_ptr(), rows, dim, eps, torch.get_num_threads())
    return total, out


def silu_mul(gate_up: Tensor) -> Tensor | None:
    """silu(gate) * up for gate_up [tokens, 2 * inter] (gate columns, then up) -> [tokens, inter]."""
    native = _native_for(gate_up)
    if native is None or gate_up.dim() != 2 or gate_up.shape[1] % 2:
        return None
    tokens, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(tokens, inter, dtype=gate_up.dtype)
    fn = native.silu_mul_bf16 if _bf16(gate_up.dtype) else native.silu_mul_f32
    fn(gate_up.data_ptr(), out.data_ptr(), tokens, inter, torch.get_num_threads())
    return out


def rotary_store_kv(qkv: Tensor, cos: Tensor, sin: Tensor, slots: Tensor, key_cache: Pages,
                    value_cache: Pages, heads: int, kv_heads: int) -> Tensor | None:
    """Rotate q and k of the fused projection, store k and v at `slots`, return q [tokens, heads, d].

    qkv: [tokens, (heads + 2 * kv_heads) * d]; cos, sin: [tokens, d // 2]; slots: [tokens] int64;
    caches: [num_blocks, block_size, kv_heads, d] of qkv's dtype, or int8 pages (kernels/kv_pages.py: the rows
    quantized as the torch store quantizes them). None when it cannot run natively.
    """
    quantized = isinstance(key_cache, Int8Pages) and isinstance(value_cache, Int8Pages)
    if quantized:
        native = _native_for(qkv, cos, sin)
        storage: tuple[Tensor, ...] = (key_cache.values, key_cache.scales, value_cache.values, value_cache.scales)
        if not all(t.device.type == "cpu" and t.is_contiguous() for t in storage):
            native = None
    else:
        native = _native_for(qkv, cos, sin, key_cache, value_cache)
        storage = (key_cache, value_cache)
    tokens = qkv.shape[0]
    d = key_cache.shape[-1] if key_cache.dim() == 4 else 0
    if native is None or d == 0 or d % 2 or qkv.dim() != 2 or qkv.shape[1] != (heads + 2 * kv_heads) * d \
            or key_cache.shape[2] != kv_heads or value_cache.shape != key_cache.shape \
            or cos.shape != (tokens, d // 2) or sin.shape != cos.shape \
            or slots.dtype != torch.int64 or slots.shape != (tokens,) or not slots.is_contiguous():
        return None
    q = torch.empty(tokens, heads, d, dtype=qkv.dtype)
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    if quantized:
        fn = native.rotary_store_q8_bf16 if _bf16(qkv.dtype) else native.rotary_store_q8_f32
    else:
        fn = native.rotary_store_bf16 if _bf16(qkv.dtype) else native.rotary_store_f32
    status = fn(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), q.data_ptr(),
                *(t.data_ptr() for t in storage), tokens, heads, kv_heads, d, num_slots, torch.get_num_threads())
    if status == -1:  # the same refusal index_copy_ gives the torch path, before anything is written
        raise InvalidRequestError(f"a KV slot lies outside the cache's {num_slots} slots")
    return q if status == 0 else None


def greedy(logits: Tensor) -> tuple[Tensor, Tensor] | None:
    """(argmax [B] int64, its log_softmax value [B] float32) of float32 or bf16 logits [B, V] without the
    [B, V] log_softmax: the first maximum (torch's tie rule) and -log(sum(exp(x - max))), in float32 on
    the values as given (bf16 widens exactly: the same results as on logits.float(), without the copy).

    None when it cannot run natively or a row holds NaN or an infinite maximum (torch decides those).
    """
    native = _native_for(logits)
    if native is None or logits.dtype not in (torch.float32, torch.bfloat16) or logits.dim() != 2 \
            or logits.shape[1] == 0:
        return None
    rows, vocab = logits.shape
    ids = torch.empty(rows, dtype=torch.int64)
    logprobs = torch.empty(rows, dtype=torch.float32)
    kernel = native.greedy_f32 if logits.dtype == torch.float32 else native.greedy_bf16
    unsettled = kernel(logits.data_ptr(), rows, vocab, ids.data_ptr(), logprobs.data_ptr(), torch.get_num_threads())
    return (ids, logprobs) if unsettled == 0 else None


def topk_values(x: Tensor, k: int) -> Tensor | None:
    """torch.topk(x, k, dim=-1).values of float32 rows [R, V] (the k largest, sorted descending; the same floats),
    from one pass per row (csrc/topk_values.c). None when it cannot run natively or a row holds NaN."""
    native = _native_for(x, dtypes=(torch.float32,))
    if native is None or x.dim() != 2 or not 1 <= k <= x.shape[1]:
        return None
    rows, cols = x.shape
    out = torch.empty(rows, k, dtype=torch.float32)
    with_nan = native.topk_values_f32(x.data_ptr(), rows, cols, k, out.data_ptr(), torch.get_num_threads())
    return out if with_nan == 0 else None
