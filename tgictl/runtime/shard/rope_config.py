"""Rotary position parameters as transformers defines them, parsed from either config shape.

Configs come in two shapes: transformers 4 writes `rope_theta` next to a `rope_scaling` dict (whose type
key is `type` in old files, `rope_type` in newer ones); transformers 5 writes one `rope_parameters`
dict that holds `rope_theta` too. Both are normalised into `RopeConfig` here, so no other module looks
at raw rope keys. Torch-free: `tgictl profile` reads configs through the same code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tgictl.errors import ConfigError, UnsupportedModelError

DEFAULT_ROPE_THETA = 10000.0
ROPE_TYPES: tuple[str, ...] = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters as transformers' `rope_parameters` defines them.

    Fields a rope type does not use keep their defaults. `long_factor`/`short_factor` are longrope's
    per-frequency divisors (head_dim // 2 values each).
    """

    rope_type: str = "default"
    theta: float = DEFAULT_ROPE_THETA
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    beta_fast: float | None = None  # yarn
    beta_slow: float | None = None  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn
    attention_factor: float | None = None  # yarn, longrope
    long_factor: tuple[float, ...] | None = None  # longrope
    short_factor: tuple[float, ...] | None = None  # longrope
    # default: one divisor per frequency, llama.cpp's `rope_freqs` tensor (its form of Llama 3's llama3 scaling);
    # tgictl's own key, written only into the configs of GGUF files (model_files/gguf_config.py)
    frequency_divisors: tuple[float, ...] | None = None


def parse_rope(config: Mapping[str, Any], rotary_dim: int, max_positions: int,
               params: Mapping[str, Any] | None = None) -> RopeConfig:
    """Normalise transformers-4 (`rope_theta` + `rope_scaling`) and -5 (`rope_parameters`) rope keys.

    rotary_dim: the dimensions rotary turns (head_dim, less under a partial rotary factor); params: the rope
    dict when it is not config's own (Gemma 3 keeps one per layer type)."""
    if params is None:
        params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(f"rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    theta = float(params.get("rope_theta", config.get("rope_theta", DEFAULT_ROPE_THETA)))
    original = params.get("original_max_position_embeddings")
    if rope_type in ("llama3", "yarn", "longrope"):
        # As transformers' standardize_rope_params: a top-level value (Phi-3 style) wins, else the
        # key inside the rope dict, else max_position_embeddings.
        original = config.get("original_max_position_embeddings", original) or max_positions

    def number(key: str) -> float | None:
        value = params.get(key)
        return None if value is None else float(value)

    if rope_type in ("linear", "dynamic", "llama3") and params.get("factor") is None:
        raise ConfigError(f"rope type {rope_type!r} needs a 'factor'")
    if rope_type == "llama3" and (params.get("low_freq_factor") is None or params.get("high_freq_factor") is None):
        raise ConfigError("rope type 'llama3' needs 'low_freq_factor' and 'high_freq_factor'")
    factors = {key: params.get(key) for key in ("long_factor", "short_factor")}
    if rope_type == "longrope":
        for key, value in factors.items():
            if not isinstance(value, list) or len(value) != rotary_dim // 2:
                raise ConfigError(f"rope type 'longrope' needs '{key}' as a list of {rotary_dim // 2} numbers")
    divisors = params.get("frequency_divisors")
    if divisors is not None and (rope_type != "default" or not isinstance(divisors, list)
                                 or len(divisors) != rotary_dim // 2):
        raise ConfigError(f"frequency_divisors must be a list of {rotary_dim // 2} numbers of the default rope type")
    return RopeConfig(
        rope_type=rope_type,
        theta=theta,
        factor=number("factor"),
        original_max_position_embeddings=None if original is None else int(original),
        low_freq_factor=number("low_freq_factor"),
        high_freq_factor=number("high_freq_factor"),
        beta_fast=number("beta_fast"),
        beta_slow=number("beta_slow"),
        mscale=number("mscale"),
        mscale_all_dim=number("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
        attention_factor=number("attention_factor"),
        long_factor=None if factors["long_factor"] is None else tuple(float(x) for x in factors["long_factor"]),
        short_factor=None if factors["short_factor"] is None else tuple(float(x) for x in factors["short_factor"]),
        frequency_divisors=None if divisors is None else tuple(float(x) for x in divisors),
    )
