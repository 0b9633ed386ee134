"""The model's architecture, parsed once from config.json (+ generation_config.json) into frozen values.

Configs come in two shapes: transformers 4 writes `rope_theta` next to a `rope_scaling` dict (whose type
key is `type` in old files, `rope_type` in newer ones); transformers 5 writes one `rope_parameters`
dict that holds `rope_theta` too. Both are normalised into `RopeConfig` here, so no other module looks
at raw config keys.

Sliding-window attention (Mistral v0.1, some Qwen2 configs) is recorded but NOT applied: the shard
attends over the full context, which is exact for every sequence no longer than the window.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgictl.errors import ConfigError, UnsupportedModelError
from tgictl.runtime.shard.moe_config import MoEConfig, moe_config
from tgictl.runtime.tensor_parallel import HeadSplit, head_split

logger = logging.getLogger(__name__)

DEFAULT_ROPE_THETA = 10000.0
ROPE_TYPES: tuple[str, ...] = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
# The MLP activations our gated MLP implements (transformers' ACT2FN names for SiLU).
SUPPORTED_ACTIVATIONS: tuple[str, ...] = ("silu", "swish")


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


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v/o projections (llama's `attention_bias`)
    mlp_bias: bool
    eos_token_ids: tuple[int, ...]  # config.json's then generation_config.json's, deduplicated
    bos_token_id: int | None = None
    sliding_window: int | None = None  # recorded only; see the module docstring
    moe: MoEConfig | None = None  # the experts of a mixture-of-experts family (moe_config.py); None: dense

    def head_split(self, rank: int, world_size: int) -> HeadSplit:
        """The attention heads rank `rank` of `world_size` holds (tgictl/runtime/tensor_parallel.py)."""
        return head_split(self.num_heads, self.num_kv_heads, rank, world_size)

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelConfig:
        """Read `model_dir`/config.json and, when present, generation_config.json."""
        model_dir = Path(model_dir)
        config = _read_json(model_dir / "config.json", required=True)
        generation = _read_json(model_dir / "generation_config.json", required=False)
        return cls.from_dict(config, generation)

    @classmethod
    def from_dict(cls, config: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
        model_type = config.get("model_type")
        if not isinstance(model_type, str):
            raise ConfigError("config.json has no model_type")
        try:
            hidden_size = int(config["hidden_size"])
            num_heads = int(config["num_attention_heads"])
            values = dict(
                vocab_size=int(config["vocab_size"]),
                num_layers=int(config["num_hidden_layers"]),
                intermediate_size=int(config["intermediate_size"]),
            )
        except KeyError as exc:
            raise ConfigError(f"config.json is missing {exc.args[0]!r}") from exc
        activation = config.get("hidden_act", "silu")
        if activation not in SUPPORTED_ACTIVATIONS:
            raise UnsupportedModelError(
                f"hidden_act {activation!r} is not supported; supported: {', '.join(SUPPORTED_ACTIVATIONS)}"
            )
        num_kv_heads = int(config.get("num_key_value_heads") or num_heads)
        head_dim = int(config.get("head_dim") or hidden_size // num_heads)
        max_positions = int(config.get("max_position_embeddings", 2048))
        sliding_window = _sliding_window(config)
        if sliding_window is not None:
            logger.info("sliding_window=%d is ignored: attention spans the whole context", sliding_window)
        return cls(
            model_type=model_type,
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope=parse_rope(config, head_dim, max_positions),
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
            eos_token_ids=_eos_ids(config, generation or {}),
            bos_token_id=_optional_int(config.get("bos_token_id")),
            sliding_window=sliding_window,
            moe=moe_config(config, values["num_layers"]),
            **values,
        )


def parse_rope(config: dict[str, Any], head_dim: int, max_positions: int) -> RopeConfig:
    """Normalise transformers-4 (`rope_theta` + `rope_scaling`) and -5 (`rope_parameters`) rope keys."""
    params: dict[str, Any] = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(f"rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial is not None and float(partial) != 1.0:
        raise UnsupportedModelError(f"partial_rotary_factor {partial} is not supported (only 1.0)")
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
            if not isinstance(value, list) or len(value) != head_dim // 2:
                raise ConfigError(f"rope type 'longrope' needs '{key}' as a list of {head_dim // 2} numbers")
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
    )


def _read_json(path: Path, *, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ConfigError(f"{path} does not exist")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)]


def _eos_ids(config: dict[str, Any], generation: dict[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for value in (config.get("eos_token_id"), generation.get("eos_token_id")):
        for token in _as_ids(value):
            if token not in ids:
                ids.append(token)
    return tuple(ids)


def _sliding_window(config: dict[str, Any]) -> int | None:
    # Qwen2 carries a window value even when `use_sliding_window` is false; only an enabled one counts.
    if config.get("use_sliding_window") is False:
        return None
    window = config.get("sliding_window")
    return None if window is None else int(window)
