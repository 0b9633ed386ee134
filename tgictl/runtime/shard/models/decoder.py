"""The decoder-only transformer every served family is (Llama 2/3, SmolLM2/3, Mistral, Qwen2/3, Gemma 2/3, Phi-3,
OLMo2, Granite, and the mixtures of experts Mixtral and Qwen3-MoE): embeddings, decoder layers of the family's
residual layout (decoder_layers.py), a final RMSNorm and the LM head, with what differs between families read from
`config.family` (family_spec.py): norms, biases, q/k norms, rotary per layer, sliding windows, soft-caps and scalars;
and `config.moe` (moe_config.py): which layers hold experts instead of the MLP. No family branches on its name here.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tgictl.kernels import AttentionMetadata
from tgictl.kernels.decode_layers import LayerShape, LayerStack, decode_layers
from tgictl.kernels.lora import StepAdapters
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.layers.attention import family_norm
from tgictl.runtime.shard.layers.embedding import ParallelLMHead, VocabParallelEmbedding, load_vocab_rows
from tgictl.runtime.shard.layers.rotary import RotaryEmbedding
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.models.base import CausalLM
from tgictl.runtime.shard.models.decoder_layers import LAYER_CLASSES
from tgictl.runtime.shard.weights import Weights

Rotary = tuple[Tensor, Tensor] | tuple[None, None]  # a layer's (cos, sin); (None, None) in a layer without positions


class DecoderForCausalLM(CausalLM):
    def __init__(
        self, config: ModelConfig, weights: Weights, *, dtype: torch.dtype, device: torch.device, dist: DistContext
    ) -> None:
        super().__init__(config, dtype=dtype, device=device, dist=dist)
        spec = config.family
        embed = load_vocab_rows(weights, "model.embed_tokens.weight", config.vocab_size)
        self.embed = VocabParallelEmbedding(embed, config.vocab_size, dist)
        layer_class = LAYER_CLASSES[spec.layout]
        self.layers = nn.ModuleList(
            layer_class(config, weights, i, layer) for i, layer in enumerate(spec.layers)
        )
        self.norm = family_norm(weights.get("model.norm.weight"), config.rms_norm_eps, spec)
        if config.tie_word_embeddings or not weights.has("lm_head.weight"):
            self.lm_head = ParallelLMHead(self.embed.weight, config.vocab_size, dist)
        else:
            head = load_vocab_rows(weights, "lm_head.weight", config.vocab_size)
            self.lm_head = ParallelLMHead(head, config.vocab_size, dist)
        # One rotary per distinct rope (Gemma 3: local and global bases); the layers index into it.
        ropes = list(dict.fromkeys(layer.rope for layer in spec.layers if layer.rope is not None))
        rotary_dim = spec.rotary_dim or config.head_dim
        self.rotaries = nn.ModuleList(
            RotaryEmbedding(rope, rotary_dim, config.max_position_embeddings, device) for rope in ropes
        )
        self.layer_rotary = [None if layer.rope is None else ropes.index(layer.rope) for layer in spec.layers]
        self._plain_stack: LayerStack | bool | None = None  # plain_layer_stack(): None until decided

    @property
    def rotary(self) -> RotaryEmbedding:
        """The first layer's rotary (the only one of most families)."""
        return self.rotaries[0]

    def embed_tokens(self, input_ids: Tensor) -> Tensor:
        """[tokens] -> [tokens, hidden], times the family's embedding scale (Gemma's rounded to the dtype first)."""
        hidden = self.embed(input_ids)
        spec = self.config.family
        if spec.embedding_scale == 1.0:
            return hidden
        if spec.embedding_scale_in_dtype:
            return hidden * torch.tensor(spec.embedding_scale).to(hidden.dtype)
        return hidden * spec.embedding_scale

    def logits(self, hidden: Tensor) -> Tensor:
        """The LM head, then the family's logit divisor and soft-cap, in the logits' dtype as transformers does."""
        with torch.inference_mode():
            logits = self.lm_head(hidden)
            spec = self.config.family
            if spec.logits_divisor != 1.0:
                logits = logits / spec.logits_divisor
            if spec.final_softcap is not None:
                logits = torch.tanh(logits / spec.final_softcap) * spec.final_softcap
            return logits

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
        hidden = self.embed_tokens(input_ids)  # [tokens, hidden]
        rotary = self._rotary(positions, meta, hidden.dtype)
        last = len(self.layers) - 1
        delta: Tensor | None = None
        first = 0
        stack = self.plain_layer_stack() if adapters is None and kv_cache.groups is None else None
        if stack is not None:
            # The layers in one compiled call: all of them where every row is a logit row (a decode step: one
            # per sequence, in order), else all but the last, which picks the logit rows in Python.
            count = len(self.layers) if logit_indices.shape[0] == hidden.shape[0] else last
            caches = [kv_cache.layer(i) for i in range(count)]
            final = (self.norm.weight, self.norm.eps) if count == len(self.layers) else None
            cos, sin = rotary[0]
            done = None
            if count > 0 and cos is not None and sin is not None:
                done = decode_layers(stack, hidden, None, cos, sin, slots, caches, meta, final)
            if done is not None:
                hidden, delta, normed = done
                if normed is not None:  # the final norm ran in the same call
                    return normed
                first = count
        inputs = kv_cache.layer_inputs(slots, meta)  # each layer's slots and block tables: its group's
        for i in range(first, len(self.layers)):
            layer = self.layers[i]
            key_cache, value_cache = kv_cache.layer(i)
            rows = logit_indices if i == last else None  # after the last attention only these rows matter
            cos, sin = rotary[i]
            layer_slots, layer_meta = inputs[i]
            hidden, delta = layer(
                hidden, delta, cos, sin, layer_slots, key_cache, value_cache, layer_meta, rows, adapters
            )
        if delta is None:  # a model without layers
            return self.norm(hidden)
        return self.norm.add_forward(hidden, delta)[1]  # [n, hidden]

    def _rotary(self, positions: Tensor, meta: AttentionMetadata, dtype: torch.dtype) -> list[Rotary]:
        """Each layer's (cos, sin) [tokens, rotary_dim // 2], every distinct rotary computed once."""
        seq_lens = None
        if any(rotary.needs_seq_lens for rotary in self.rotaries):
            # [tokens] each token's sequence length (cache_len + new_len), for length-dependent rope
            new_lens = torch.tensor(meta.new_lens, dtype=torch.int64, device=meta.context_lens.device)
            seq_lens = meta.context_lens.repeat_interleave(new_lens)
        tables = [rotary(positions, seq_lens if rotary.needs_seq_lens else None, dtype) for rotary in self.rotaries]
        return [(None, None) if index is None else tables[index] for index in self.layer_rotary]

    def plain_layer_stack(self) -> LayerStack | None:
        """The layers as kernels/decode_layers.py's stack, when the family runs Llama's loop (FamilySpec's
        runs_llama_loop: every field at Llama's default but one shared rotary and window) and every layer's weights
        are what the loop reads; decided once, on the first forward (after load, when the weights no longer move)."""
        if self._plain_stack is None:
            self._plain_stack = False
            layers = list(self.layers)
            if layers and self.config.family.runs_llama_loop() and self.config.moe is None:
                attention, mlp = layers[0].attention, layers[0].mlp
                shape = LayerShape(
                    hidden_size=self.config.hidden_size, heads=attention.num_heads, kv_heads=attention.num_kv_heads,
                    head_dim=attention.head_dim, intermediate=mlp.down.weight.in_features,
                    eps=layers[0].input_norm.eps, scale=attention.scale, window=attention.window,
                )
                plain = [p for p in (layer.plain_weights(shape) for layer in layers) if p is not None]
                if len(plain) == len(layers):
                    self._plain_stack = LayerStack.build(shape, plain) or False
        return self._plain_stack or None
