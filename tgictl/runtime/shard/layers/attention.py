"""Self-attention over the paged KV cache, tensor-parallel by heads.

One fused column-parallel matmul gives this rank's q, k and v heads (from three checkpoint tensors, or Phi-3's one
`qkv_proj`); q and k are normalised where the family does (per head, or over all heads), rotated (the first
`rotary_dim` dimensions of each head; not at all in a layer without positions), the new K/V are written to their
slots, and the kernel attends over each sequence's blocks, within the layer's sliding window if it has one, with
the family's softmax scale and score soft-cap. The output projection is row-parallel (all-reduce).

Ranks hold whole KV-head groups (a KV head and the query heads that read it) as evenly as possible,
so the split need not divide the heads; with more ranks than KV heads a KV head is replicated on the
ranks that share its group (tgictl/runtime/tensor_parallel.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tgictl import kernels
from tgictl.kernels import AttentionMetadata, fused
from tgictl.kernels.lora import StepAdapters
from tgictl.runtime.shard.family_spec import FamilySpec, LayerSpec
from tgictl.runtime.shard.layers.linear import ColumnParallelLinear, RowParallelLinear
from tgictl.runtime.shard.layers.norm import FullWidthRMSNorm, RMSNorm
from tgictl.runtime.shard.layers.rotary import apply_rotary
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.weights import RowRange, Weights
from tgictl.runtime.tensor_parallel import head_split


def family_norm(weight: Tensor, eps: float, spec: FamilySpec) -> RMSNorm:
    """An RMSNorm with the family's offset and rounding."""
    return RMSNorm(weight, eps, offset=spec.norm_offset, weight_in_float32=spec.norm_weight_in_float32)


class PagedAttention(nn.Module):
    def __init__(self, config: ModelConfig, weights: Weights, prefix: str, layer: LayerSpec) -> None:
        super().__init__()
        spec = config.family
        dist = weights.dist
        d = config.head_dim
        self.head_dim = d
        split = config.head_split(dist.rank, dist.world_size)
        self.num_heads = split.q_count
        self.num_kv_heads = split.kv_count
        self.scale = d**-0.5 if spec.attention_scale is None else spec.attention_scale
        self.softcap = spec.attention_softcap
        self.window = layer.window
        self.rotary_dim = 0 if layer.rope is None else (spec.rotary_dim or d)
        q_rows = (split.q_start * d, (split.q_start + split.q_count) * d)
        kv_rows = (split.kv_start * d, (split.kv_start + split.kv_count) * d)
        # qkv weight: [(heads + 2 * kv_heads) * head_dim, hidden], rows q | k | v of this rank
        parts: list[RowRange]
        if spec.fused_qkv is None:
            parts = [(f"{prefix}.q_proj", *q_rows), (f"{prefix}.k_proj", *kv_rows), (f"{prefix}.v_proj", *kv_rows)]
        else:
            fused_name, q_width, kv_width = f"{prefix}.{spec.fused_qkv}", config.num_heads * d, config.num_kv_heads * d
            parts = [(fused_name, *q_rows), (fused_name, q_width + kv_rows[0], q_width + kv_rows[1]),
                     (fused_name, q_width + kv_width + kv_rows[0], q_width + kv_width + kv_rows[1])]
        self.qkv = ColumnParallelLinear.load_ranges(weights, parts, bias=spec.qkv_bias)
        self.o_proj = RowParallelLinear.load_columns(weights, f"{prefix}.o_proj", *q_rows, bias=spec.o_bias)
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        eps = config.rms_norm_eps
        if spec.qk_norm == "per_head":
            self.q_norm = family_norm(weights.get(f"{prefix}.q_norm.weight"), eps, spec)
            self.k_norm = family_norm(weights.get(f"{prefix}.k_norm.weight"), eps, spec)
        elif spec.qk_norm == "full_width":
            q_norm = family_norm(weights.get_range(f"{prefix}.q_norm.weight", 0, *q_rows), eps, spec)
            k_norm = family_norm(weights.get_range(f"{prefix}.k_norm.weight", 0, *kv_rows), eps, spec)
            # a KV head replicated on several ranks adds to the sum of squares on the first rank holding it
            earlier = {kv for r in range(dist.rank)
                       for s in [head_split(config.num_heads, config.num_kv_heads, r, dist.world_size)]
                       for kv in range(s.kv_start, s.kv_start + s.kv_count)}
            counted = torch.tensor([kv not in earlier for kv in range(split.kv_start, split.kv_start + split.kv_count)])
            self.q_norm = FullWidthRMSNorm(q_norm, config.num_heads * d, dist)
            self.k_norm = FullWidthRMSNorm(k_norm, config.num_kv_heads * d, dist, counted)

    def forward(
        self,
        hidden: Tensor,
        cos: Tensor | None,
        sin: Tensor | None,
        slots: Tensor,
        key_cache: Tensor,
        value_cache: Tensor,
        meta: AttentionMetadata,
        rows: Tensor | None = None,
        adapters: StepAdapters | None = None,
    ) -> Tensor:
        """hidden: [tokens, hidden]; cos, sin: [tokens, rotary_dim // 2] (None in a layer without positions);
        slots: [tokens] int64.

        rows: [n] optional token rows whose output is wanted (the last layer needs only the rows the
        LM head reads); every token's K/V is stored regardless. Returns [tokens or n, hidden].
        adapters: the step's LoRA groupings, None when no row uses an adapter.
        """
        tokens = hidden.shape[0]
        h, d = self.num_heads, self.head_dim
        qkv = self.qkv(hidden, adapters.tokens if adapters else None)  # [tokens, (h + 2 * kvh) * d]
        q = None
        if self.q_norm is None and self.rotary_dim == d and cos is not None and sin is not None:
            # rotary and the KV store in one compiled pass where it can run
            q = fused.rotary_store_kv(qkv, cos, sin, slots, key_cache, value_cache, h, self.num_kv_heads)
        if q is None:
            q = self.torch_rotary_store(qkv, cos, sin, slots, key_cache, value_cache)
        out = kernels.attention(q, key_cache, value_cache, meta, self.scale, self.softcap, self.window)
        out = out.reshape(tokens, h * d)  # [tokens, h * d]
        if rows is not None:
            out = out.index_select(0, rows)
        return self.o_proj(out, adapters.for_rows(rows is not None) if adapters else None)

    def torch_rotary_store(
        self, qkv: Tensor, cos: Tensor | None, sin: Tensor | None, slots: Tensor, key_cache: Tensor, value_cache: Tensor
    ) -> Tensor:
        """The torch ops of the q/k norms, rotary and the KV store: the reference of kernels/fused.py's
        rotary_store_kv. Returns q [tokens, h, d]."""
        tokens = qkv.shape[0]
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        v = qkv[:, (h + kvh) * d :].view(tokens, kvh, d)
        qk = qkv[:, : (h + kvh) * d].view(tokens, h + kvh, d)
        if self.q_norm is not None and self.k_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :h]), self.k_norm(qk[:, h:])), dim=1)
        if cos is not None and sin is not None:
            qk = rotate(qk, cos, sin, self.rotary_dim)  # q and k rotate together: one op over [tokens, h + kvh, d]
        kernels.store_kv(qk[:, h:], v, key_cache, value_cache, slots)
        return qk[:, :h]


def rotate(x: Tensor, cos: Tensor, sin: Tensor, rotary_dim: int) -> Tensor:
    """x [tokens, heads, d] with its first rotary_dim dimensions rotated (all of them: the plain rotary)."""
    if rotary_dim == x.shape[-1]:
        return apply_rotary(x, cos, sin)
    return torch.cat((apply_rotary(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)
