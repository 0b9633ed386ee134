"""A decode step's decoder layers as one compiled call (csrc/decode_layers.c) where the step allows it.

Why: at batch 1 a layer is eight compiled calls (norms, projections, rotary and KV store, attention,
silu * up), and the Python between them (module calls, checks, tensor allocation, ctypes arguments)
costs about as much as the attention and the norms together, 30 times per token on SmolLM2. The C loop
makes the same calls with the same arguments in the same order, so it returns the Python layers'
results bit for bit (tests/unit/runtime/shard/test_plain_layer_stack.py holds it to them).

It runs when every row decodes one token (1-4 rows: the matrix-vector kernels' range; 5-32 rows where
the many-row kernels run: AMX on bf16 weights, else VDPBF16PS (FMA on AVX2 CPUs), csrc/int4_bf16.c on int4
tiles, AMX or VDPBF16PS on decoded int8 rows), in bf16 on the CPU, on one rank, without LoRA rows and outside
--batch-invariant, over a bf16 or an int8 KV cache (--kv-cache-dtype int8: the int8 store and attention kernels
the Python layers call on it); the model says whether its layers have the plain shape (Llama's layer: no biases
but an optional q|k|v one (Qwen2's, added by the projection's kernel as the Python call adds it), no q/k norms,
no softcap, SiLU, one rotary, at most one sliding window shared by every layer; projections dense
bf16, int4 tiles (--quantize int4 and a GGUF's Q4_0 / Q4_1) or int8 rows (--quantize int8)): `LayerStack`. Otherwise the caller
runs its layers in Python. int4 and int8 projections are multiplied by the C kernels even where the dispatch
table would pick torch's for that shape (the loop cannot call torch; the two differ by float rounding, and the
calls the loop saves are worth more than the table's margin).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tgictl.errors import InvalidRequestError
from tgictl.kernels.batch_invariance import batch_invariant
from tgictl.kernels.kv_pages import Int8Pages, Pages
from tgictl.kernels.linear import AMX_FIRST_MAX_ROWS, SMALL_LINEAR_MAX_ROWS
from tgictl.kernels.linear_descriptor import LinearDescriptor, linear_descriptor, runs_many_rows
from tgictl.kernels.linear_methods import LinearWeight
from tgictl.kernels.metadata import AttentionMetadata, check_attention_inputs
from tgictl.kernels.native import load_native_kernels
from tgictl.kernels.window import windowed


_MAX_Q8_HEAD = 512  # csrc/fused_layers.c's MAX_Q8_HEAD: the int8 store's largest head size


@dataclass(frozen=True)
class LayerShape:
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    scale: float
    window: int | None = None  # every layer's sliding window (Mistral's), None for full attention

    def projections(self) -> tuple[tuple[int, int], ...]:
        """(out, in) of qkv, o, gate_up and down: the loop's order."""
        h, q_width = self.hidden_size, self.heads * self.head_dim
        return ((q_width + 2 * self.kv_heads * self.head_dim, h), (h, q_width), (2 * self.intermediate, h),
                (h, self.intermediate))


@dataclass(frozen=True)
class PlainLayer:
    """One layer's weights as the loop reads them: the two norms', the four projections' and q|k|v's bias."""

    input_norm: Tensor
    post_norm: Tensor
    projections: tuple[LinearWeight, LinearWeight, LinearWeight, LinearWeight]  # qkv, o, gate_up, down
    qkv_bias: Tensor | None = None  # [(heads + 2 kv_heads) head_dim] (Qwen2's), or None


class LayerStack:
    """Consecutive decoder layers as the C loop reads them (pointers into tensors the model holds: the
    stack keeps them referenced, and weights never move after load)."""

    def __init__(self, shape: LayerShape, layers: Sequence[PlainLayer],
                 descriptors: Sequence[LinearDescriptor]) -> None:
        self.shape = shape
        self.count = len(layers)
        self._layers = tuple(layers)  # keeps every pointer's tensor alive
        norms = [t for layer in layers for t in (layer.input_norm, layer.post_norm)]
        self.norm_pointers = (ctypes.c_void_p * len(norms))(*(t.data_ptr() for t in norms))
        self.linears = (LinearDescriptor * len(descriptors))(*descriptors)
        # The float32 copy of each q|k|v bias that the Python layers' kernels receive (made once here, not per call);
        # no array at all when no layer has one.
        self._qkv_biases = tuple(None if layer.qkv_bias is None else layer.qkv_bias.float().contiguous()
                                 for layer in layers)
        self.qkv_bias_pointers = None if all(b is None for b in self._qkv_biases) else \
            (ctypes.c_void_p * len(layers))(*(None if b is None else b.data_ptr() for b in self._qkv_biases))
        self.max_rows = AMX_FIRST_MAX_ROWS if all(runs_many_rows(w) for layer in layers for w in layer.projections) \
            else SMALL_LINEAR_MAX_ROWS[torch.bfloat16]
        self._caches: tuple[tuple[Tensor, ...], ctypes.Array[ctypes.c_void_p]] | None = None

    @classmethod
    def build(cls, shape: LayerShape, layers: Sequence[PlainLayer]) -> LayerStack | None:
        """The stack, or None when some layer's weights are not what the loop reads."""
        descriptors: list[LinearDescriptor] = []
        for layer in layers:
            norms_ok = all(t.device.type == "cpu" and t.dtype == torch.bfloat16 and t.is_contiguous()
                           and tuple(t.shape) == (shape.hidden_size,) for t in (layer.input_norm, layer.post_norm))
            found = [linear_descriptor(w, out_in) for w, out_in in zip(layer.projections, shape.projections())]
            bias = layer.qkv_bias
            bias_ok = bias is None or (bias.device.type == "cpu" and tuple(bias.shape) == (shape.projections()[0][0],))
            if not norms_ok or not bias_ok or any(d is None for d in found):
                return None
            descriptors.extend(d for d in found if d is not None)
        return cls(shape, layers, descriptors) if layers else None

    def cache_pointers(self, caches: Sequence[tuple[Pages, Pages]]) -> ctypes.Array[ctypes.c_void_p]:
        """Key and value cache pointers per layer (int8: values and scales of each), rebuilt only when the cache
        tensors change (warmup)."""
        flat = tuple(t for pair in caches for pages in pair
                     for t in ((pages.values, pages.scales) if isinstance(pages, Int8Pages) else (pages,)))
        if self._caches is None or len(self._caches[0]) != len(flat) \
                or any(a is not b for a, b in zip(self._caches[0], flat)):
            self._caches = flat, (ctypes.c_void_p * len(flat))(*(t.data_ptr() for t in flat))
        return self._caches[1]


def decode_layers(stack: LayerStack, hidden: Tensor, delta: Tensor | None, cos: Tensor, sin: Tensor, slots: Tensor,
                  caches: Sequence[tuple[Pages, Pages]], meta: AttentionMetadata,
                  final_norm: tuple[Tensor, float] | None = None) -> tuple[Tensor, Tensor, Tensor | None] | None:
    """The stack's first len(caches) layers on a decode step: (hidden, delta, None) after them, as the Python
    layers return them, or None when this step cannot run in the C loop (nothing has been computed then).
    With `final_norm` (the model's norm weight [H] and eps, after the last layer): (hidden + delta, delta,
    norm(hidden + delta)), the norm by the same kernel as the Python model's (fused.rms_norm), in the same call
    (its Python round trip cost ~50-70 us of a one-row step with the caches cold); a weight the kernel does not
    take leaves the third None, for the caller to compute.

    hidden, delta: [m, H] bf16 (delta None before the first layer); cos, sin: [m, d / 2]; slots: [m];
    caches: the (key, value) caches [blocks, block_size, kv_heads, d] of the stack's first 1..count layers.
    """
    shape = stack.shape
    m = hidden.shape[0]
    decode = meta.decode
    if not 1 <= m <= stack.max_rows or hidden.dtype != torch.bfloat16 \
            or hidden.device.type != "cpu" or batch_invariant() or not meta.is_decode_only or decode is None \
            or decode.query_rows is not None or not 1 <= len(caches) <= stack.count:
        return None
    half = shape.head_dim // 2
    inputs = (hidden, cos, sin) if delta is None else (hidden, delta, cos, sin)
    if any(t.dtype != torch.bfloat16 or not t.is_contiguous() for t in inputs) \
            or hidden.shape != (m, shape.hidden_size) or (delta is not None and delta.shape != hidden.shape) \
            or cos.shape != (m, half) or sin.shape != cos.shape \
            or slots.dtype != torch.int64 or slots.shape != (m,) or not slots.is_contiguous():
        return None
    key_cache, value_cache = caches[0]
    kv_int8 = isinstance(key_cache, Int8Pages)
    # every layer's caches in one format: bf16, or int8 with head sizes its store kernel takes (csrc/fused_layers.c)
    same_format = all(isinstance(pages, Int8Pages) == kv_int8 for pair in caches for pages in pair)
    if not same_format or (key_cache.dtype != torch.bfloat16 and not (kv_int8 and shape.head_dim <= _MAX_Q8_HEAD)) \
            or not all(k.is_contiguous() and v.is_contiguous() for k, v in caches) \
            or key_cache.dim() != 4 or key_cache.shape[2] != shape.kv_heads:
        return None
    native = load_native_kernels()
    if native is None:
        return None
    query = torch.empty(m, shape.heads, shape.head_dim, dtype=torch.bfloat16)  # shape only, for the checks
    check_attention_inputs(query, key_cache, value_cache, meta)
    decode = windowed(meta, shape.window).decode  # every layer's rows over their window's positions only
    if decode is None:
        return None
    hidden_out = hidden.clone()
    delta_out = delta.clone() if delta is not None else torch.empty_like(hidden)
    scratch = torch.empty(native.decode_layers_scratch(m, shape.hidden_size, shape.heads, shape.kv_heads,
                                                       shape.head_dim, shape.intermediate), dtype=torch.uint8)
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    norm_weight, norm_eps = final_norm if final_norm is not None else (None, 0.0)
    normed = None
    if norm_weight is not None and norm_weight.dtype == torch.bfloat16 and norm_weight.device.type == "cpu" \
            and norm_weight.is_contiguous() and norm_weight.shape == (shape.hidden_size,):
        normed = torch.empty_like(hidden)
    status = native.decode_layers_bf16(
        len(caches), stack.norm_pointers, stack.linears, stack.qkv_bias_pointers, stack.cache_pointers(caches),
        hidden_out.data_ptr(),
        delta_out.data_ptr(), int(delta is not None), cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
        decode.slots.data_ptr(), decode.context_lens.data_ptr(), decode.max_context_len, m, shape.hidden_size, shape.heads, shape.kv_heads,
        shape.head_dim, shape.intermediate, num_slots, shape.eps, shape.scale,
        None if normed is None else norm_weight.data_ptr(), norm_eps,  # type: ignore[union-attr]
        None if normed is None else normed.data_ptr(), scratch.data_ptr(), torch.get_num_threads(), int(kv_int8))
    if status == -1:  # the refusal the Python path's KV store gives, before anything is written
        raise InvalidRequestError(f"a KV slot lies outside the cache's {num_slots} slots")
    if status != 0:
        raise MemoryError("the decode layers' kernels could not allocate their scratch memory")
    return hidden_out, delta_out, normed
