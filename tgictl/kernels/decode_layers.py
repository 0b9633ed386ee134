"""A decode step's decoder layers as one compiled call (csrc/decode_layers.c) where the step allows it.

Why: at batch 1 a layer is eight compiled calls (norms, projections, rotary and KV store, attention,
silu * up), and the Python between them (module calls, checks, tensor allocation, ctypes arguments)
costs about as much as the attention and the norms together, 30 times per token on SmolLM2. The C loop
makes the same calls with the same arguments in the same order, so it returns the Python layers'
results bit for bit (tests/unit/kernels/test_decode_layers.py holds it to them).

It runs when every row decodes one token (1-4 rows: the matrix-vector kernel's range), in bf16 on the
CPU, on one rank, without LoRA rows and outside --batch-invariant; the model says whether its layers
have the plain shape (dense bf16 weights, no biases, no q/k norms, no softcap): `LayerStack`. Otherwise
the caller runs its layers in Python.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tgictl.errors import InvalidRequestError
from tgictl.kernels.batch_invariance import batch_invariant
from tgictl.kernels.linear import SMALL_LINEAR_MAX_ROWS
from tgictl.kernels.metadata import AttentionMetadata, check_attention_inputs
from tgictl.kernels.native import load_native_kernels

# The order csrc/decode_layers.c reads each layer's weights in.
LAYER_WEIGHTS = ("input_norm", "qkv", "o", "post_norm", "gate_up", "down")


@dataclass(frozen=True)
class LayerShape:
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    scale: float


class LayerStack:
    """The weights of consecutive decoder layers as the C loop reads them (pointers into tensors the
    model holds: the stack keeps them referenced, and weights never move after load)."""

    def __init__(self, shape: LayerShape, layers: Sequence[Sequence[Tensor]]) -> None:
        self.shape = shape
        self.count = len(layers)
        self._tensors = [t for layer in layers for t in layer]
        self._pointers = (ctypes.c_void_p * len(self._tensors))(*(t.data_ptr() for t in self._tensors))
        self._caches: tuple[tuple[Tensor, ...], ctypes.Array[ctypes.c_void_p]] | None = None

    @property
    def weight_pointers(self) -> ctypes.Array[ctypes.c_void_p]:
        return self._pointers

    @staticmethod
    def accepts(weights: Sequence[Tensor], shape: LayerShape) -> bool:
        """Whether one layer's weights (LAYER_WEIGHTS order) are what the C loop reads."""
        h, q_width = shape.hidden_size, shape.heads * shape.head_dim
        expected = [(h,), (q_width + 2 * shape.kv_heads * shape.head_dim, h), (h, q_width), (h,),
                    (2 * shape.intermediate, h), (h, shape.intermediate)]
        return len(weights) == len(expected) and all(
            t.device.type == "cpu" and t.dtype == torch.bfloat16 and t.is_contiguous() and tuple(t.shape) == s
            for t, s in zip(weights, expected))

    def cache_pointers(self, caches: Sequence[tuple[Tensor, Tensor]]) -> ctypes.Array[ctypes.c_void_p]:
        """Key and value cache pointers per layer, rebuilt only when the cache tensors change (warmup)."""
        flat = tuple(t for pair in caches for t in pair)
        if self._caches is None or len(self._caches[0]) != len(flat) \
                or any(a is not b for a, b in zip(self._caches[0], flat)):
            self._caches = flat, (ctypes.c_void_p * len(flat))(*(t.data_ptr() for t in flat))
        return self._caches[1]


def decode_layers(stack: LayerStack, hidden: Tensor, delta: Tensor | None, cos: Tensor, sin: Tensor, slots: Tensor,
                  caches: Sequence[tuple[Tensor, Tensor]], meta: AttentionMetadata) -> tuple[Tensor, Tensor] | None:
    """The stack's layers on a decode step: (hidden, delta) after them, as the Python layers return
    them, or None when this step cannot run in the C loop (nothing has been computed then).

    hidden, delta: [m, H] bf16 (delta None before the first layer); cos, sin: [m, d / 2]; slots: [m];
    caches: the stack's layers' (key, value) caches [blocks, block_size, kv_heads, d].
    """
    shape = stack.shape
    m = hidden.shape[0]
    decode = meta.decode
    if not 1 <= m <= SMALL_LINEAR_MAX_ROWS[torch.bfloat16] or hidden.dtype != torch.bfloat16 \
            or hidden.device.type != "cpu" or batch_invariant() or not meta.is_decode_only or decode is None \
            or decode.query_rows is not None or len(caches) != stack.count or stack.count == 0:
        return None
    half = shape.head_dim // 2
    inputs = (hidden, cos, sin) if delta is None else (hidden, delta, cos, sin)
    if any(t.dtype != torch.bfloat16 or not t.is_contiguous() for t in inputs) \
            or hidden.shape != (m, shape.hidden_size) or (delta is not None and delta.shape != hidden.shape) \
            or cos.shape != (m, half) or sin.shape != cos.shape \
            or slots.dtype != torch.int64 or slots.shape != (m,) or not slots.is_contiguous():
        return None
    key_cache, value_cache = caches[0]
    if key_cache.dtype != torch.bfloat16 or not all(k.is_contiguous() and v.is_contiguous() for k, v in caches) \
            or key_cache.dim() != 4 or key_cache.shape[2] != shape.kv_heads:
        return None
    native = load_native_kernels()
    if native is None:
        return None
    query = torch.empty(m, shape.heads, shape.head_dim, dtype=torch.bfloat16)  # shape only, for the checks
    check_attention_inputs(query, key_cache, value_cache, meta)
    hidden_out = hidden.clone()
    delta_out = delta.clone() if delta is not None else torch.empty_like(hidden)
    scratch = torch.empty(native.decode_layers_scratch(m, shape.hidden_size, shape.heads, shape.kv_heads,
                                                       shape.head_dim, shape.intermediate), dtype=torch.bfloat16)
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    status = native.decode_layers_bf16(
        stack.count, stack.weight_pointers, stack.cache_pointers(caches), hidden_out.data_ptr(), delta_out.data_ptr(),
        int(delta is not None), cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), decode.slots.data_ptr(),
        decode.context_lens.data_ptr(), decode.max_context_len, m, shape.hidden_size, shape.heads, shape.kv_heads,
        shape.head_dim, shape.intermediate, num_slots, shape.eps, shape.scale, scratch.data_ptr(),
        torch.get_num_threads())
    if status == -1:  # the refusal the Python path's KV store gives, before anything is written
        raise InvalidRequestError(f"a KV slot lies outside the cache's {num_slots} slots")
    if status != 0:
        raise MemoryError("the decode layers' kernels could not allocate their scratch memory")
    return hidden_out, delta_out
