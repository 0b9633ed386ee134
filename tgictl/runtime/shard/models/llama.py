"""Llama-architecture decoder (Llama 2/3, SmolLM2, Mistral): pre-norm blocks of paged attention and a
gated SiLU MLP, RMSNorm, rotary positions, optionally tied embeddings.

Qwen2/Qwen3 reuse it with different attention options (qwen.py); a family is a subclass that
says which biases and norms its checkpoints carry.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tgictl.kernels import AttentionMetadata
from tgictl.kernels.lora import StepAdapters
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.layers.attention import AttentionOptions, PagedAttention
from tgictl.runtime.shard.layers.embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
    load_vocab_rows,
)
from tgictl.runtime.shard.layers.mlp import GatedMLP
from tgictl.runtime.shard.layers.norm import RMSNorm
from tgictl.runtime.shard.layers.rotary import RotaryEmbedding
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.models.base import CausalLM
from tgictl.runtime.shard.weights import Weights


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, weights: Weights, prefix: str, options: AttentionOptions) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_norm = RMSNorm(weights.get(f"{prefix}.input_layernorm.weight"), eps)
        self.attention = PagedAttention(config, weights, f"{prefix}.self_attn", options)
        self.post_attention_norm = RMSNorm(weights.get(f"{prefix}.post_attention_layernorm.weight"), eps)
        self.mlp = GatedMLP.load(weights, f"{prefix}.mlp", bias=config.mlp_bias)

    def forward(
        self,
        hidden: Tensor,
        delta: Tensor | None,
        cos: Tensor,
        sin: Tensor,
        slots: Tensor,
        key_cache: Tensor,
        value_cache: Tensor,
        meta: AttentionMetadata,
        rows: Tensor | None = None,
        adapters: StepAdapters | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The residual stream is hidden + delta (delta: the previous layer's MLP output, None before
        the first layer), added here together with the input norm, in one pass (docs/architecture.md,
        "Decode step"). hidden, delta: [tokens, hidden]. Returns this layer's (hidden, delta), each
        [tokens, hidden], or [n, hidden] for `rows` [n] when given."""
        if delta is None:
            normed = self.input_norm(hidden)
        else:
            hidden, normed = self.input_norm.add_forward(hidden, delta)
        attended = self.attention(normed, cos, sin, slots, key_cache, value_cache, meta, rows, adapters)
        residual = hidden if rows is None else hidden.index_select(0, rows)
        hidden, normed = self.post_attention_norm.add_forward(residual, attended)
        mlp_adapters = adapters.for_rows(rows is not None) if adapters else None
        return hidden, self.mlp(normed, mlp_adapters)


class LlamaForCausalLM(CausalLM):
    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=config.attention_bias, o_bias=config.attention_bias, qk_norm=False)

    def __init__(
        self, config: ModelConfig, weights: Weights, *, dtype: torch.dtype, device: torch.device, dist: DistContext
    ) -> None:
        super().__init__(config, dtype=dtype, device=device, dist=dist)
        options = self.attention_options(config)
        embed = load_vocab_rows(weights, "model.embed_tokens.weight", config.vocab_size)
        self.embed = VocabParallelEmbedding(embed, config.vocab_size, dist)
        self.layers = nn.ModuleList(
            DecoderLayer(config, weights, f"model.layers.{i}", options) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(weights.get("model.norm.weight"), config.rms_norm_eps)
        if config.tie_word_embeddings or not weights.has("lm_head.weight"):
            self.lm_head = ParallelLMHead(self.embed.weight, config.vocab_size, dist)
        else:
            head = load_vocab_rows(weights, "lm_head.weight", config.vocab_size)
            self.lm_head = ParallelLMHead(head, config.vocab_size, dist)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, config.max_position_embeddings, device)

    def compute_logits(
        self,
        input_ids: Tensor,
        positions: Tensor,
        slots: Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        logit_indices: Tensor,
        adapters: StepAdapters | None = None,
    ) -> Tensor:
        seq_lens = None
        if self.rotary.needs_seq_lens:
            # [tokens] each token's sequence length (cache_len + new_len), for length-dependent rope
            new_lens = torch.tensor(meta.new_lens, dtype=torch.int64, device=meta.context_lens.device)
            seq_lens = meta.context_lens.repeat_interleave(new_lens)
        hidden = self.embed(input_ids)  # [tokens, hidden]
        cos, sin = self.rotary(positions, seq_lens, hidden.dtype)  # [tokens, head_dim // 2]
        last = len(self.layers) - 1
        delta: Tensor | None = None
        for i, layer in enumerate(self.layers):
            key_cache, value_cache = kv_cache.layer(i)
            rows = logit_indices if i == last else None  # after the last attention only these rows matter
            hidden, delta = layer(hidden, delta, cos, sin, slots, key_cache, value_cache, meta, rows, adapters)
        if delta is None:  # a model without layers
            return self.lm_head(self.norm(hidden))
        return self.lm_head(self.norm.add_forward(hidden, delta)[1])  # [n, vocab] float32


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral's architecture is Llama's; its sliding window is ignored (see model_config)."""
