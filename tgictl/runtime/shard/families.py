"""The model families tgictl serves: one entry per config.json `model_type`, saying how its config becomes a
`FamilySpec` and which GGUF architecture llama.cpp writes it as (docs/adding-a-model.md).

This is the one list of families: the shard's registry (models/registry.py), the GGUF paths
(model_files/gguf_model.py, gguf_file.py), the tiny test models and `tgictl profile` all read it, and a test holds
them to it. Each builder reads exactly what transformers' modeling code for the family reads, and refuses with one
line naming the field any setting whose outputs it would not reproduce. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.runtime.shard.family_spec import Activation, FamilySpec, LayerSpec
from tgictl.runtime.shard.rope_config import RopeConfig, parse_rope

FULL, SLIDING = "full_attention", "sliding_attention"
# transformers' ACT2FN names our gated MLP implements, by activation.
ACTIVATIONS: Mapping[str, Activation] = MappingProxyType(
    {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
)
# Flags of transformers configs that change outputs in ways no family here implements: present and not falsy -> refused.
UNSUPPORTED_FLAGS: tuple[str, ...] = ("use_bidirectional_attention", "attention_chunk_size", "use_mrope")


@dataclass(frozen=True)
class Dimensions:
    """The config values every builder needs, parsed once by ModelConfig."""

    hidden_size: int
    num_layers: int
    head_dim: int
    max_positions: int


SpecBuilder = Callable[[Mapping[str, Any], Dimensions], FamilySpec]


@dataclass(frozen=True)
class Family:
    spec: SpecBuilder
    gguf_architecture: str | None  # general.architecture llama.cpp's converter writes; None: it writes none


def _flag(config: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = config.get(key)
    return default if value is None else bool(value)


def _activation(config: Mapping[str, Any], key: str, default: str) -> Activation:
    name = config.get(key) or default
    if name not in ACTIVATIONS:
        raise UnsupportedModelError(f"{key} {name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def _partial_rotary(config: Mapping[str, Any]) -> float:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return float(params.get("partial_rotary_factor", config.get("partial_rotary_factor")) or 1.0)


def _rope(config: Mapping[str, Any], dims: Dimensions, rotary_dim: int | None = None) -> RopeConfig:
    if rotary_dim is None and _partial_rotary(config) != 1.0:
        raise UnsupportedModelError(f"partial_rotary_factor {_partial_rotary(config)} is not supported for "
                                    f"{config.get('model_type')!r} (only 1.0)")
    return parse_rope(config, rotary_dim or dims.head_dim, dims.max_positions)


def _layer_types(config: Mapping[str, Any], dims: Dimensions, default: Sequence[str]) -> list[str]:
    types = config.get("layer_types") or list(default)
    if len(types) != dims.num_layers:
        raise ConfigError(f"layer_types has {len(types)} entries for {dims.num_layers} layers")
    for kind in types:
        if kind not in (FULL, SLIDING):
            raise UnsupportedModelError(f"layer type {kind!r} is not supported; supported: {FULL}, {SLIDING}")
    return list(types)


def _windowed_layers(ropes: Sequence[RopeConfig | None], types: Sequence[str], window: Any) -> tuple[LayerSpec, ...]:
    if window is None and SLIDING in types:
        raise ConfigError("layer_types has sliding_attention layers but sliding_window is null")
    size = None if window is None else int(window)
    if size is not None and size < 1:
        raise ConfigError(f"sliding_window must be a positive number of positions, got {window!r}")
    return tuple(LayerSpec(rope, size if kind == SLIDING else None) for rope, kind in zip(ropes, types))


def _same_window(config: Mapping[str, Any], dims: Dimensions, rope: RopeConfig,
                 default: int | None) -> tuple[LayerSpec, ...]:
    """Every layer attends within config's sliding_window, or the whole context when it is null (Mistral, Phi-3);
    `default` when the key is absent (the transformers config class's)."""
    window = config.get("sliding_window", default)
    return _windowed_layers([rope] * dims.num_layers, [FULL if window is None else SLIDING] * dims.num_layers, window)


def _full(dims: Dimensions, rope: RopeConfig) -> tuple[LayerSpec, ...]:
    return tuple(LayerSpec(rope) for _ in range(dims.num_layers))


def _act(config: Mapping[str, Any]) -> Activation:
    return _activation(config, "hidden_act", "silu")


def llama(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    bias = _flag(config, "attention_bias")
    return FamilySpec(qkv_bias=bias, o_bias=bias, mlp_bias=_flag(config, "mlp_bias"), activation=_act(config),
                      layers=_full(dims, _rope(config, dims)))


def mistral(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    return FamilySpec(activation=_act(config), layers=_same_window(config, dims, _rope(config, dims), 4096))


def _qwen_layers(config: Mapping[str, Any], dims: Dimensions) -> tuple[LayerSpec, ...]:
    """transformers' Qwen2/Qwen3: a window only with use_sliding_window, on the layers from max_window_layers on."""
    window = config.get("sliding_window", 4096) if _flag(config, "use_sliding_window") else None
    first = int(config.get("max_window_layers", 28) or 0)
    default = [SLIDING if window is not None and i >= first else FULL for i in range(dims.num_layers)]
    rope = _rope(config, dims)
    return _windowed_layers([rope] * dims.num_layers, _layer_types(config, dims, default), window)


def qwen2(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    # q/k/v always biased, o never
    return FamilySpec(qkv_bias=True, activation=_act(config), layers=_qwen_layers(config, dims))


def qwen3(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    bias = _flag(config, "attention_bias")
    return FamilySpec(qkv_bias=bias, o_bias=bias, qk_norm="per_head", activation=_act(config),
                      layers=_qwen_layers(config, dims))


def mixtral(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    """Mistral's attention (MixtralConfig's sliding_window defaults to none); the experts: moe_config.py."""
    return FamilySpec(activation=_act(config), layers=_same_window(config, dims, _rope(config, dims), None))


def qwen3_moe(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    """Qwen3's attention; Qwen3-MoE has no max_window_layers: use_sliding_window's window holds on every layer. The
    experts: moe_config.py."""
    return qwen3({**config, "max_window_layers": 0}, dims)


def _gemma(config: Mapping[str, Any], dims: Dimensions, ropes: Sequence[RopeConfig], default: Sequence[str],
           gemma3: bool) -> FamilySpec:
    """Gemma 2 and 3; absent keys take their transformers config classes' defaults. Gemma 3 adds per-head q/k norms,
    and its attention in transformers reads no attn_logit_softcapping (its configs leave it null)."""
    bias = _flag(config, "attention_bias")

    def optional(key: str, default: float | None) -> float | None:
        value = config.get(key, default)
        return None if value is None else float(value)

    return FamilySpec(
        layout="sandwich", norm_offset=1.0, norm_weight_in_float32=True, qkv_bias=bias, o_bias=bias,
        qk_norm="per_head" if gemma3 else "none",
        attention_scale=float(config.get("query_pre_attn_scalar", 256)) ** -0.5,
        attention_softcap=None if gemma3 else optional("attn_logit_softcapping", 50.0),
        activation=_activation(config, "hidden_activation", "gelu_pytorch_tanh"),
        embedding_scale=dims.hidden_size**0.5, embedding_scale_in_dtype=True,
        final_softcap=optional("final_logit_softcapping", None if gemma3 else 30.0),
        layers=_windowed_layers(ropes, _layer_types(config, dims, default), config.get("sliding_window", 4096)),
    )


def gemma2(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    alternate = [SLIDING if (i + 1) % 2 else FULL for i in range(dims.num_layers)]
    return _gemma(config, dims, [_rope(config, dims)] * dims.num_layers, alternate, gemma3=False)


def gemma3_text(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    """Local (sliding) and global layers, each kind with its own rotary: transformers 5 keeps one rope dict per
    layer type; transformers 4 wrote rope_theta (global), rope_local_base_freq and rope_scaling (global)."""
    pattern = int(config.get("sliding_window_pattern") or 6)
    default = [SLIDING if (i + 1) % pattern else FULL for i in range(dims.num_layers)]
    types = _layer_types(config, dims, default)
    params = config.get("rope_parameters") or {}
    if FULL in params or SLIDING in params:
        per_type = {kind: dict(params.get(kind) or {}) for kind in (FULL, SLIDING)}
    else:
        per_type = {FULL: {**(config.get("rope_scaling") or {}), "rope_theta": config.get("rope_theta", 1e6)},
                    SLIDING: {"rope_type": "default", "rope_theta": config.get("rope_local_base_freq", 1e4)}}
    per_type[FULL].setdefault("rope_theta", 1e6)
    per_type[SLIDING].setdefault("rope_theta", 1e4)
    ropes = {kind: parse_rope(config, dims.head_dim, dims.max_positions, per_type[kind]) for kind in (FULL, SLIDING)}
    return _gemma(config, dims, [ropes[kind] for kind in types], types, gemma3=True)


def phi3(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    rotary_dim = int(dims.head_dim * _partial_rotary(config))
    if rotary_dim < 2 or rotary_dim % 2:
        raise ConfigError(f"partial_rotary_factor {_partial_rotary(config)} leaves {rotary_dim} rotary dimensions")
    rope = _rope(config, dims, rotary_dim)
    return FamilySpec(rotary_dim=None if rotary_dim == dims.head_dim else rotary_dim, activation=_act(config),
                      fused_qkv="qkv_proj", fused_gate_up="gate_up_proj",
                      layers=_same_window(config, dims, rope, None))


def smollm3(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    """Every no_rope_layer_interval-th layer (no_rope_layers[i] == 0) has no positions; sliding windows only with
    use_sliding_window, on the layer_types' sliding layers (transformers derives them from the NoPE layers)."""
    interval = int(config.get("no_rope_layer_interval") or 4)
    uses_rope = config.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(dims.num_layers)]
    if len(uses_rope) != dims.num_layers:
        raise ConfigError(f"no_rope_layers has {len(uses_rope)} entries for {dims.num_layers} layers")
    window = config.get("sliding_window") if _flag(config, "use_sliding_window") else None
    default = [SLIDING if window is not None and not uses_rope[i] else FULL for i in range(dims.num_layers)]
    types = _layer_types(config, dims, default)
    rope = _rope(config, dims)
    bias = _flag(config, "attention_bias")
    return FamilySpec(qkv_bias=bias, o_bias=bias, mlp_bias=_flag(config, "mlp_bias"), activation=_act(config),
                      layers=_windowed_layers([rope if use else None for use in uses_rope], types, window))


def olmo2(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    bias = _flag(config, "attention_bias")
    return FamilySpec(layout="post_norm", norm_weight_in_float32=True, qkv_bias=bias, o_bias=bias,
                      qk_norm="full_width", activation=_act(config), layers=_full(dims, _rope(config, dims)))


def granite(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    bias = _flag(config, "attention_bias")

    def number(key: str) -> float:
        value = config.get(key)
        return 1.0 if value is None else float(value)

    return FamilySpec(qkv_bias=bias, o_bias=bias, mlp_bias=_flag(config, "mlp_bias"), activation=_act(config),
                      attention_scale=number("attention_multiplier"), embedding_scale=number("embedding_multiplier"),
                      residual_scale=number("residual_multiplier"), logits_divisor=number("logits_scaling"),
                      layers=_full(dims, _rope(config, dims)))


FAMILIES: Mapping[str, Family] = MappingProxyType({
    "llama": Family(llama, "llama"),
    "mistral": Family(mistral, "llama"),  # llama.cpp writes Mistral models as llama
    "qwen2": Family(qwen2, "qwen2"),
    "qwen3": Family(qwen3, "qwen3"),
    "gemma2": Family(gemma2, "gemma2"),
    "gemma3_text": Family(gemma3_text, "gemma3"),
    "phi3": Family(phi3, "phi3"),
    "smollm3": Family(smollm3, "smollm3"),
    "olmo2": Family(olmo2, "olmo2"),
    "granite": Family(granite, "granite"),
    # Mixtures of experts: the experts replace the MLP (moe_config.py).
    "mixtral": Family(mixtral, "llama"),  # llama.cpp writes Mixtral as llama with llama.expert_count
    "qwen3_moe": Family(qwen3_moe, "qwen3moe"),
})


def supported_model_types() -> list[str]:
    return sorted(FAMILIES)


def family_spec(config: Mapping[str, Any], dims: Dimensions) -> FamilySpec:
    """The spec of config's family; UnsupportedModelError for an unknown model_type or a flag it does not implement."""
    model_type = config.get("model_type")
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(supported_model_types())}"
        )
    for flag in UNSUPPORTED_FLAGS:
        if config.get(flag):
            raise UnsupportedModelError(f"{flag}={config[flag]!r} is not supported (model_type {model_type!r})")
    return family.spec(config, dims)
