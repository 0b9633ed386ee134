"""What a model family adds to the dimensions `tgictl profile` sizes, read from config.json by the shard's own
family rules (runtime/shard/families.py, torch-free): the parameters of its norms and biases, whether the shard
keeps its norms in float32, and each layer's sliding window.

Windows do not change what the KV cache holds today (the router's allocator keeps every layer's blocks for a
sequence's whole life); `windowed_kv_bytes_per_token` is what it would hold per token if the blocks every local
layer has left behind were freed, which the report shows beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.runtime.shard.families import Dimensions, family_spec


@dataclass(frozen=True)
class FamilyShape:
    norms_per_layer: int = 2  # hidden-sized RMSNorm weights per layer (Gemma's sandwich: 4)
    norms_in_float32: bool = False  # the shard keeps norm weights in float32 (Gemma's 1 + w, OLMo2)
    qk_norm: str = "none"  # "per_head": head_dim each for q and k; "full_width": every head's
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    layer_windows: tuple[int | None, ...] = ()  # per layer; None: the whole context (empty: all of them)


def family_shape(config: Mapping[str, Any], text: Mapping[str, Any], num_layers: int, hidden: int,
                 head_dim: int) -> FamilyShape:
    """The family facts of config.json (`text`: the language model's part); a model type the shard does not
    serve, or a setting it refuses, gets Llama's (the profile of another server's model stays possible)."""
    dims = Dimensions(hidden_size=hidden, num_layers=num_layers, head_dim=head_dim,
                      max_positions=int(text.get("max_position_embeddings") or 2048))
    try:
        spec = family_spec({**text, "model_type": text.get("model_type", config.get("model_type"))}, dims)
    except (UnsupportedModelError, ConfigError):
        return FamilyShape(qkv_bias=bool(text.get("attention_bias", False)))
    return FamilyShape(
        norms_per_layer=4 if spec.layout == "sandwich" else 2,
        norms_in_float32=spec.norm_weight_in_float32,
        qk_norm=spec.qk_norm,
        qkv_bias=spec.qkv_bias,
        o_bias=spec.o_bias,
        mlp_bias=spec.mlp_bias,
        layer_windows=spec.windows,
    )


def windowed_kv_bytes_per_token(windows: Sequence[int | None], tokens: int, layer_bytes_per_token: int) -> float:
    """KV bytes per token of a `tokens`-long sequence if each layer kept only its window's positions (the
    average over the sequence's tokens of what every layer holds at its end)."""
    if tokens <= 0 or not windows:
        return float(len(windows) * layer_bytes_per_token)
    kept = sum(tokens if window is None else min(tokens, window) for window in windows)
    return kept * layer_bytes_per_token / tokens


def windowed_kv(windows: Sequence[int | None], kv_token: int, max_total: int) -> tuple[int, str]:
    """(value, source) of the profile's windowed KV figure: bytes per token at max_total_tokens if the blocks every
    sliding-window layer has left behind were freed; kv_token: every layer's bytes per token."""
    if not any(window is not None for window in windows):
        return kv_token, "no sliding windows: every layer keeps every position"
    value = round(windowed_kv_bytes_per_token(windows, max_total, kv_token // len(windows)))
    local = sum(window is not None for window in windows)
    # The paged cache holds a position for every layer in one block: only when every layer has a window can the
    # router give blocks back (docs/scheduling.md, "Sliding windows"); a global layer keeps them all.
    kept = ("the router frees the blocks behind every layer's window as sequences grow" if local == len(windows)
            else "the KV cache keeps every block while a global layer needs it")
    return value, (f"at max_total_tokens ({max_total}) if the {local} of {len(windows)} layers with a sliding window "
                   f"kept only its positions; {kept}")
