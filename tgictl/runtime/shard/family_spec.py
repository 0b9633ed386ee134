"""What makes a model family differ from Llama, as data: the shared layers read a frozen `FamilySpec` and no
family branches on its name (docs/adding-a-model.md).

Every field's default is Llama's, so `FamilySpec()` with one `LayerSpec` per layer is a Llama model. The C decode
loop (kernels/decode_layers.py) admits a model only when `runs_llama_loop` says every field but those it computes
(_LOOP_FIELDS: the layers and a q|k|v bias) has that default, so a field added here can never run the Llama loop
by accident. Mixture-of-experts settings are not here: MoE is an MLP
of its own with its own configuration. Torch-free: `tgictl profile` reads the windows from the same spec.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

from tgictl.runtime.shard.rope_config import RopeConfig

Layout = Literal["pre_norm", "sandwich", "post_norm"]
QKNorm = Literal["none", "per_head", "full_width"]
Activation = Literal["silu", "gelu_tanh"]


@dataclass(frozen=True)
class LayerSpec:
    """What one decoder layer does that its neighbours may not."""

    rope: RopeConfig | None  # this layer's rotary positions; None: no positions at all (SmolLM3's NoPE layers)
    window: int | None = None  # sliding window in positions (itself included); None: the whole context


# FamilySpec fields the C decode loop computes at any value (the rest must be at Llama's default).
_LOOP_FIELDS = frozenset({"layers", "qkv_bias"})


@dataclass(frozen=True)
class FamilySpec:
    """A family's differences from Llama; the defaults are Llama's."""

    # Residual layout: pre_norm (Llama: x + f(norm(x))), sandwich (Gemma: x + norm(f(norm(x)))), post_norm
    # (OLMo2: x + norm(f(x))). The only difference that earns a layer class of its own.
    layout: Layout = "pre_norm"
    # RMSNorm: weight + norm_offset (Gemma stores w for 1 + w), applied in float32 before the cast back
    # (Gemma, OLMo2) instead of after it (Llama); equal in float32, different roundings in bf16.
    norm_offset: float = 0.0
    norm_weight_in_float32: bool = False
    # Attention.
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: QKNorm = "none"  # RMSNorm on q and k before rotary: per head (Qwen3, Gemma 3) or over all heads (OLMo2)
    attention_scale: float | None = None  # softmax scale; None: head_dim ** -0.5
    attention_softcap: float | None = None  # scores = cap * tanh(scores / cap) (Gemma 2)
    rotary_dim: int | None = None  # dimensions rotary turns (Phi-3's partial rotary); None: the whole head
    # MLP: down(act(gate) * up).
    activation: Activation = "silu"
    mlp_bias: bool = False
    # Scalars on the residual stream and the logits.
    embedding_scale: float = 1.0  # embeddings * scale (Gemma: sqrt(hidden); Granite: embedding_multiplier)
    embedding_scale_in_dtype: bool = False  # the scale rounded to the serving dtype first (Gemma)
    residual_scale: float = 1.0  # x + f(x) * scale (Granite's residual_multiplier)
    logits_divisor: float = 1.0  # logits / divisor (Granite's logits_scaling)
    final_softcap: float | None = None  # logits = cap * tanh(logits / cap) (Gemma 2 and 3)
    # Checkpoint names of fused projections (Phi-3): one tensor holding q|k|v rows, one holding gate|up rows.
    fused_qkv: str | None = None
    fused_gate_up: str | None = None
    # One entry per decoder layer.
    layers: tuple[LayerSpec, ...] = ()

    @property
    def windows(self) -> tuple[int | None, ...]:
        return tuple(layer.window for layer in self.layers)

    @property
    def lora_targets(self) -> dict[str, str]:
        """The projections a LoRA adapter may target, by PEFT's module name, with the block holding each."""
        attention = (self.fused_qkv,) if self.fused_qkv else ("q_proj", "k_proj", "v_proj")
        mlp = (self.fused_gate_up,) if self.fused_gate_up else ("gate_proj", "up_proj")
        blocks = {name: "self_attn" for name in (*attention, "o_proj")}
        return blocks | {name: "mlp" for name in (*mlp, "down_proj")}

    def runs_llama_loop(self) -> bool:
        """Whether the C decode loop (Llama's layer, one rotary and at most one window for every layer, an optional
        q|k|v bias) computes this family: every other field at its Llama default, every layer alike and positioned,
        no other layer field set."""
        llama = FamilySpec()
        # The loop adds a q|k|v bias (Qwen2's) as the Python layers do: the one field it computes off the default.
        if any(getattr(self, f.name) != getattr(llama, f.name) for f in fields(self) if f.name not in _LOOP_FIELDS):
            return False
        if not self.layers or len(set(self.layers)) != 1 or self.layers[0].rope is None:
            return False
        # A LayerSpec field the loop does not know (anything but the rotary and the window) must be at its default.
        first = self.layers[0]
        return first == replace(LayerSpec(rope=first.rope), window=first.window)
