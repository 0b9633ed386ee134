"""Llama-architecture decoder (Llama 2/3, SmolLM2, Mistral): pre-norm blocks of paged attention and a
gated SiLU MLP, RMSNorm, rotary positions, optionally tied embeddings.

Qwen2/Qwen3 reuse it with different attention options (qwen.py); a family is a subclass that
says which biases and norms its checkpoints carry.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tgictl.kernels import AttentionMetadata
from tgictl.kernels.decode_layers import (
    LayerShape,
    LayerStack,
    PlainLayer,
    decode_layers,
)
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
from tgictl.runtime.shard.layers.moe import SparseMoE
from tgictl.runtime.shard.layers.norm import RMSNorm
from tgictl.runtime.shard.layers.rotary import RotaryEmbedding
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.models.base import CausalLM
from tgictl.runtime.shard.weights import Weights


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, weights: Weights, index: int, options: AttentionOptions) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        prefix = f"model.layers.{index}"
        self.input_norm = RMSNorm(weights.get(f"{prefix}.input_layernorm.weight"), eps)
        self.attention = PagedAttention(config, weights, f"{prefix}.self_attn", options)
        self.post_attention_norm = RMSNorm(weights.get(f"{prefix}.post_attention_layernorm.weight"), eps)
        self.mlp: GatedMLP | SparseMoE = SparseMoE.load(weights, prefix, config.moe) \
            if config.moe is not None and config.moe.is_sparse(index) \
            else GatedMLP.load(weights, f"{prefix}.mlp", bias=config.mlp_bias)

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

    def plain_weights(self, shape: LayerShape) -> PlainLayer | None:
        """This layer's weights for kernels/decode_layers.py's loop when it is the plain layer the loop
        computes (no biases, no q/k norms, one rank; the loop checks the weights' formats), else None."""
        attention, mlp = self.attention, self.mlp
        if not isinstance(mlp, GatedMLP):  # an MoE layer never runs the dense loop
            return None
        linears = (attention.qkv, attention.o_proj, mlp.gate_up, mlp.down)
        if attention.q_norm is not None or any(linear.bias is not None for linear in linears) \
                or attention.o_proj.dist.is_sharded or mlp.down.dist.is_sharded \
                or self.input_norm.eps != shape.eps or self.post_attention_norm.eps != shape.eps \
                or attention.scale != shape.scale:
            return None
        return PlainLayer(self.input_norm.weight, self.post_attention_norm.weight,
                          (attention.qkv.weight, attention.o_proj.weight, mlp.gate_up.weight, mlp.down.weight))


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
            DecoderLayer(config, weights, i, options) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(weights.get("model.norm.weight"), config.rms_norm_eps)
        if config.tie_word_embeddings or not weights.has("lm_head.weight"):
            self.lm_head = ParallelLMHead(self.embed.weight, config.vocab_size, dist)
        else:
            head = load_vocab_rows(weights, "lm_head.weight", config.vocab_size)
            self.lm_head = ParallelLMHead(head, config.vocab_size, dist)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, config.max_position_embeddings, device)
        self._plain_stack: LayerStack | bool | None = None  # plain_layer_stack(): None until decided

    def compute_hidden(
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
        first = 0
        stack = self.plain_layer_stack() if adapters is None else None
        if stack is not None:
            # The layers in one compiled call: all of them where every row is a logit row (a decode step: one
            # per sequence, in order), else all but the last, which picks the logit rows in Python.
            count = len(self.layers) if logit_indices.shape[0] == hidden.shape[0] else last
            caches = [kv_cache.layer(i) for i in range(count)]
            final = (self.norm.weight, self.norm.eps) if count == len(self.layers) else None
            done = decode_layers(stack, hidden, None, cos, sin, slots, caches, meta, final) if count > 0 else None
            if done is not None:
                hidden, delta, normed = done
                if normed is not None:  # the final norm ran in the same call
                    return normed
                first = count
        for i in range(first, len(self.layers)):
            layer = self.layers[i]
            key_cache, value_cache = kv_cache.layer(i)
            rows = logit_indices if i == last else None  # after the last attention only these rows matter
            hidden, delta = layer(hidden, delta, cos, sin, slots, key_cache, value_cache, meta, rows, adapters)
        if delta is None:  # a model without layers
            return self.norm(hidden)
        return self.norm.add_forward(hidden, delta)[1]  # [n, hidden]

    def plain_layer_stack(self) -> LayerStack | None:
        """The layers as kernels/decode_layers.py's stack, when all are plain layers; decided once, on the
        first forward (after load, when the weights no longer move)."""
        if self._plain_stack is None:
            self._plain_stack = False
            layers = list(self.layers)
            if layers and self.config.moe is None:
                attention, mlp = layers[0].attention, layers[0].mlp
                shape = LayerShape(
                    hidden_size=self.config.hidden_size, heads=attention.num_heads, kv_heads=attention.num_kv_heads,
                    head_dim=attention.head_dim, intermediate=mlp.down.weight.in_features,
                    eps=layers[0].input_norm.eps, scale=attention.scale,
                )
                plain = [p for p in (layer.plain_weights(shape) for layer in layers) if p is not None]
                if len(plain) == len(layers):
                    self._plain_stack = LayerStack.build(shape, plain) or False
        return self._plain_stack or None


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral's architecture is Llama's; its sliding window is ignored (see model_config)."""
