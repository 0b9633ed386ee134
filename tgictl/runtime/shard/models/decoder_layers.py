"""The decoder layers, one class per residual layout (the only family difference that earns a class; the rest is
data in FamilySpec, read by the shared attention, MLP and norms):

- `DecoderLayer`, pre-norm (Llama and most families): x + attn(norm(x)), then the same around the MLP;
- `SandwichDecoderLayer` (Gemma 2, 3): x + norm(attn(norm(x))), then the same around the MLP;
- `PostNormDecoderLayer` (OLMo2): x + norm(attn(x)), then the same around the MLP.

Every layer takes and returns the residual stream as (hidden, delta), their sum the stream, delta the last output
still to be added (None before the first layer): the next norm adds it in the same pass (docs/architecture.md,
"Decode step"). A family's residual scale (Granite) multiplies each output before it is added.
"""

from __future__ import annotations

from torch import Tensor, nn

from tgictl.kernels import AttentionMetadata
from tgictl.kernels.decode_layers import LayerShape, PlainLayer
from tgictl.kernels.lora import StepAdapters
from tgictl.runtime.shard.family_spec import LayerSpec
from tgictl.runtime.shard.layers.attention import PagedAttention, family_norm
from tgictl.runtime.shard.layers.mlp import GatedMLP
from tgictl.runtime.shard.layers.moe import SparseMoE
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.weights import Weights


class DecoderLayer(nn.Module):
    """Pre-norm: input_layernorm before attention, post_attention_layernorm before the MLP."""

    # attribute -> the norm's checkpoint name under the layer's prefix
    norm_names: dict[str, str] = {"input_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm"}

    def __init__(self, config: ModelConfig, weights: Weights, index: int, layer: LayerSpec) -> None:
        super().__init__()
        spec = config.family
        prefix = f"model.layers.{index}"
        for attribute, name in self.norm_names.items():
            setattr(self, attribute, family_norm(weights.get(f"{prefix}.{name}.weight"), config.rms_norm_eps, spec))
        self.attention = PagedAttention(config, weights, f"{prefix}.self_attn", layer)
        # A mixture-of-experts family's sparse layers hold experts (config.moe, layers/moe/) instead of the MLP.
        self.mlp: GatedMLP | SparseMoE = SparseMoE.load(weights, prefix, config.moe) \
            if config.moe is not None and config.moe.is_sparse(index) \
            else GatedMLP.load(weights, f"{prefix}.mlp", bias=spec.mlp_bias, activation=spec.activation,
                               fused_gate_up=spec.fused_gate_up)
        self.residual_scale = spec.residual_scale

    def scaled(self, x: Tensor) -> Tensor:
        return x if self.residual_scale == 1.0 else x * self.residual_scale

    def forward(
        self,
        hidden: Tensor,
        delta: Tensor | None,
        cos: Tensor | None,
        sin: Tensor | None,
        slots: Tensor,
        key_cache: Tensor,
        value_cache: Tensor,
        meta: AttentionMetadata,
        rows: Tensor | None = None,
        adapters: StepAdapters | None = None,
    ) -> tuple[Tensor, Tensor]:
        """hidden, delta: [tokens, hidden]; cos, sin: this layer's rotary [tokens, rotary_dim // 2] (None: no
        positions). Returns this layer's (hidden, delta), each [tokens, hidden], or [n, hidden] for `rows` [n]."""
        hidden, normed = _add_norm(self.input_norm, hidden, delta)
        attended = self.attention(normed, cos, sin, slots, key_cache, value_cache, meta, rows, adapters)
        residual = hidden if rows is None else hidden.index_select(0, rows)
        hidden, normed = self.post_attention_norm.add_forward(residual, self.scaled(attended))
        mlp_adapters = adapters.for_rows(rows is not None) if adapters else None
        return hidden, self.scaled(self.mlp(normed, mlp_adapters))

    def plain_weights(self, shape: LayerShape) -> PlainLayer | None:
        """This layer's weights for kernels/decode_layers.py's loop when it is the plain layer the loop
        computes (this class, no biases but q|k|v's, no q/k norms, SiLU, one rank; the family spec and the loop check the
        rest), else None."""
        attention, mlp = self.attention, self.mlp
        if type(mlp) is not GatedMLP:  # an MoE layer never runs the dense loop
            return None
        input_norm, post_norm = self.input_norm, self.post_attention_norm
        linears = (attention.qkv, attention.o_proj, mlp.gate_up, mlp.down)
        if type(self) is not DecoderLayer or mlp.activation != "silu" \
                or attention.q_norm is not None or any(linear.bias is not None for linear in linears[1:]) \
                or attention.o_proj.dist.is_sharded or mlp.down.dist.is_sharded \
                or input_norm.eps != shape.eps or post_norm.eps != shape.eps or input_norm.weight_in_float32 \
                or post_norm.weight_in_float32 or attention.scale != shape.scale or attention.softcap is not None \
                or attention.rotary_dim != attention.head_dim or self.residual_scale != 1.0:
            return None
        return PlainLayer(input_norm.weight, post_norm.weight,
                          (attention.qkv.weight, attention.o_proj.weight, mlp.gate_up.weight, mlp.down.weight),
                          attention.qkv.bias)


class SandwichDecoderLayer(DecoderLayer):
    """Gemma's: each block's output normalised before it joins the residual stream, and the MLP's input too."""

    norm_names = {"input_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                  "pre_feedforward_norm": "pre_feedforward_layernorm",
                  "post_feedforward_norm": "post_feedforward_layernorm"}

    def forward(self, hidden: Tensor, delta: Tensor | None, cos: Tensor | None, sin: Tensor | None, slots: Tensor,
                key_cache: Tensor, value_cache: Tensor, meta: AttentionMetadata, rows: Tensor | None = None,
                adapters: StepAdapters | None = None) -> tuple[Tensor, Tensor]:
        hidden, normed = _add_norm(self.input_norm, hidden, delta)
        attended = self.post_attention_norm(self.attention(normed, cos, sin, slots, key_cache, value_cache, meta,
                                                           rows, adapters))
        residual = hidden if rows is None else hidden.index_select(0, rows)
        hidden, normed = self.pre_feedforward_norm.add_forward(residual, self.scaled(attended))
        mlp_adapters = adapters.for_rows(rows is not None) if adapters else None
        return hidden, self.scaled(self.post_feedforward_norm(self.mlp(normed, mlp_adapters)))


class PostNormDecoderLayer(DecoderLayer):
    """OLMo2's: the blocks read the residual stream as it is; their outputs are normalised before they join it."""

    norm_names = {"post_attention_norm": "post_attention_layernorm",
                  "post_feedforward_norm": "post_feedforward_layernorm"}

    def forward(self, hidden: Tensor, delta: Tensor | None, cos: Tensor | None, sin: Tensor | None, slots: Tensor,
                key_cache: Tensor, value_cache: Tensor, meta: AttentionMetadata, rows: Tensor | None = None,
                adapters: StepAdapters | None = None) -> tuple[Tensor, Tensor]:
        if delta is not None:
            hidden = hidden + delta
        attended = self.post_attention_norm(self.attention(hidden, cos, sin, slots, key_cache, value_cache, meta,
                                                           rows, adapters))
        residual = hidden if rows is None else hidden.index_select(0, rows)
        hidden = residual + self.scaled(attended)
        mlp_adapters = adapters.for_rows(rows is not None) if adapters else None
        return hidden, self.scaled(self.post_feedforward_norm(self.mlp(hidden, mlp_adapters)))


LAYER_CLASSES: dict[str, type[DecoderLayer]] = {
    "pre_norm": DecoderLayer,
    "sandwich": SandwichDecoderLayer,
    "post_norm": PostNormDecoderLayer,
}


def _add_norm(norm: nn.Module, hidden: Tensor, delta: Tensor | None) -> tuple[Tensor, Tensor]:
    """(hidden + delta, norm(hidden + delta)), the add skipped before the first layer."""
    if delta is None:
        return hidden, norm(hidden)
    return norm.add_forward(hidden, delta)
