"""What a model family adds to the dimensions `tgictl profile` sizes, read from config.json by the shard's own
family rules (runtime/shard/families.py, torch-free): the parameters of its norms and biases, whether the shard
keeps its norms in float32, and each layer's sliding window.

`windowed_kv_bytes_per_token` is what the KV cache would hold per token if every sliding-window layer kept exactly
its window's positions; `layer_groups` is how the run-time pool splits the KV memory when local and global layers
mix (tgictl/kv_groups.py), and `pooled_kv` what that pool holds per token, which the report shows beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.kv_groups import GroupShape, hybrid_window, local_keep, split_blocks
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
    # docs/scheduling.md, "Sliding windows": what the run-time pool keeps is pooled_kv (the release margin, and with
    # global layers too the split of the memory between the two layer groups).
    kept = ("the router frees whole blocks behind every layer's window as sequences grow" if local == len(windows)
            else "the run-time pool frees the local layers' blocks behind the window (pooled_kv)")
    return value, (f"at max_total_tokens ({max_total}) if the {local} of {len(windows)} layers with a sliding window "
                   f"kept only its positions; {kept}")


def layer_groups(windows: Sequence[int | None], kv_token: int, block_size: int) -> GroupShape | None:
    """The two groups' block bytes (kv_token: every layer's bytes per token) when local and global layers mix."""
    window = hybrid_window(windows)
    if window is None:
        return None
    local = sum(w is not None for w in windows)
    per_layer = kv_token // len(windows) * block_size
    return GroupShape((len(windows) - local) * per_layer, local * per_layer, window)


def pooled_kv(windows: Sequence[int | None], kv_token: int, kv_memory: int, block_size: int,
              max_total: int) -> tuple[int, str]:
    """(value, source) of what the run-time KV pool holds per token of a max_total-long sequence: the release
    margin (a window keeps 2 blocks more) and, with two layer groups, the split of the memory counted in."""
    if not any(window is not None for window in windows):
        return kv_token, "no sliding windows: every layer keeps every position"
    groups = layer_groups(windows, kv_token, block_size)
    if groups is None:  # every layer windowed: one pool, whole blocks freed behind the narrowest window
        keep = min(max_total, local_keep(min(w for w in windows if w is not None), block_size))
        return round(kv_token * keep / max(max_total, 1)), (
            f"at max_total_tokens ({max_total}): the router frees whole blocks behind every layer's window, less "
            f"one block of margin and the partial block ({keep} positions kept)")
    global_blocks, local_blocks = split_blocks(kv_memory, groups, block_size, max_total)
    if global_blocks < 2:
        return kv_token, "two KV layer groups, but the KV memory does not hold one max_total_tokens request in both"
    pool = global_blocks * groups.global_block_bytes + local_blocks * groups.local_block_bytes
    value = round(pool / ((global_blocks - 1) * block_size))
    return value, (
        f"two KV layer groups (kv_groups.py): {global_blocks} blocks of the global layers, {local_blocks} of the "
        f"sliding-window ones, a local block freed once the window ({groups.window}) and a block of margin lie "
        f"behind it; the pool's bytes per position it holds, for requests of max_total_tokens ({max_total})")
