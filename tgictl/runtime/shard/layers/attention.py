"""Self-attention over the paged KV cache, tensor-parallel by heads.

One fused column-parallel matmul gives this rank's q, k and v heads; rotary is applied to q and k,
the new K/V are written to their slots, and the kernel attends over each sequence's blocks. The
output projection is row-parallel (all-reduce).

Ranks hold whole KV-head groups (a KV head and the query heads that read it) as evenly as possible,
so the split need not divide the heads; with more ranks than KV heads a KV head is replicated on the
ranks that share its group (tgictl/runtime/tensor_parallel.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from tgictl import kernels
from tgictl.kernels import AttentionMetadata, fused
from tgictl.kernels.lora import StepAdapters
from tgictl.runtime.shard.layers.linear import ColumnParallelLinear, RowParallelLinear
from tgictl.runtime.shard.layers.norm import RMSNorm
from tgictl.runtime.shard.layers.rotary import apply_rotary
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.weights import Weights


@dataclass(frozen=True)
class AttentionOptions:
    """What differs between families: biases (qwen2 has q/k/v bias only) and qwen3's per-head q/k norm."""

    qkv_bias: bool
    o_bias: bool
    qk_norm: bool


class PagedAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        weights: Weights,
        prefix: str,
        options: AttentionOptions,
    ) -> None:
        super().__init__()
        dist = weights.dist
        d = config.head_dim
        self.head_dim = d
        split = config.head_split(dist.rank, dist.world_size)
        self.num_heads = split.q_count
        self.num_kv_heads = split.kv_count
        self.scale = d**-0.5
        q_rows = (split.q_start * d, (split.q_start + split.q_count) * d)
        kv_rows = (split.kv_start * d, (split.kv_start + split.kv_count) * d)
        # qkv weight: [(heads + 2 * kv_heads) * head_dim, hidden], rows q | k | v of this rank
        self.qkv = ColumnParallelLinear.load_ranges(
            weights,
            [(f"{prefix}.q_proj", *q_rows), (f"{prefix}.k_proj", *kv_rows), (f"{prefix}.v_proj", *kv_rows)],
            bias=options.qkv_bias,
        )
        self.o_proj = RowParallelLinear.load_columns(weights, f"{prefix}.o_proj", *q_rows, bias=options.o_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if options.qk_norm:
            self.q_norm = RMSNorm(weights.get(f"{prefix}.q_norm.weight"), config.rms_norm_eps)
            self.k_norm = RMSNorm(weights.get(f"{prefix}.k_norm.weight"), config.rms_norm_eps)

    def forward(
        self,
        hidden: Tensor,
        cos: Tensor,
        sin: Tensor,
        slots: Tensor,
        key_cache: Tensor,
        value_cache: Tensor,
        meta: AttentionMetadata,
        rows: Tensor | None = None,
        adapters: StepAdapters | None = None,
    ) -> Tensor:
        """hidden: [tokens, hidden]; cos, sin: [tokens, head_dim // 2]; slots: [tokens] int64.

        rows: [n] optional token rows whose output is wanted (the last layer needs only the rows the
        LM head reads); every token's K/V is stored regardless. Returns [tokens or n, hidden].
        adapters: the step's LoRA groupings, None when no row uses an adapter.
        """
        tokens = hidden.shape[0]
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv(hidden, adapters.tokens if adapters else None)  # [tokens, (h + 2 * kvh) * d]
        q = None
        if self.q_norm is None:  # rotary and the KV store in one compiled pass where it can run
            q = fused.rotary_store_kv(qkv, cos, sin, slots, key_cache, value_cache, h, kvh)
        if q is None:
            q = self.torch_rotary_store(qkv, cos, sin, slots, key_cache, value_cache)
        out = kernels.attention(q, key_cache, value_cache, meta, self.scale)  # [tokens, h, d]
        out = out.reshape(tokens, h * d)
        if rows is not None:
            out = out.index_select(0, rows)
        return self.o_proj(out, adapters.for_rows(rows is not None) if adapters else None)

    def torch_rotary_store(
        self, qkv: Tensor, cos: Tensor, sin: Tensor, slots: Tensor, key_cache: Tensor, value_cache: Tensor
    ) -> Tensor:
        """The torch ops of rotary (after qwen3's q/k norms) and the KV store: the reference of
        kernels/fused.py's rotary_store_kv. Returns q [tokens, h, d]."""
        tokens = qkv.shape[0]
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        v = qkv[:, (h + kvh) * d :].view(tokens, kvh, d)
        if self.q_norm is None or self.k_norm is None:
            # q and k rotate together: one op over [tokens, h + kvh, d]
            qk = apply_rotary(qkv[:, : (h + kvh) * d].view(tokens, h + kvh, d), cos, sin)
            q, k = qk[:, :h], qk[:, h:]
        else:
            q = apply_rotary(self.q_norm(qkv[:, : h * d].view(tokens, h, d)), cos, sin)
            k = apply_rotary(self.k_norm(qkv[:, h * d : (h + kvh) * d].view(tokens, kvh, d)), cos, sin)
        kernels.store_kv(k, v, key_cache, value_cache, slots)
        return q
