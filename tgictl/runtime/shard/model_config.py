"""The model's architecture, parsed once from config.json (+ generation_config.json) into frozen values: the
dimensions every family shares here, what the family does differently in `family` (families.py: biases, norms,
rotary per layer (rope_config.py), sliding windows, scalars). No other module looks at raw config keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgictl.errors import ConfigError
from tgictl.runtime.shard.families import Dimensions, family_spec
from tgictl.runtime.shard.family_spec import FamilySpec
from tgictl.runtime.shard.moe_config import MoEConfig, moe_config
from tgictl.runtime.shard.rope_config import RopeConfig
from tgictl.runtime.tensor_parallel import HeadSplit, head_split


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
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]  # config.json's then generation_config.json's, deduplicated
    family: FamilySpec  # what the family does differently from Llama, one LayerSpec per layer
    bos_token_id: int | None = None
    moe: MoEConfig | None = None  # the experts of a mixture-of-experts family (moe_config.py); None: dense

    @property
    def rope(self) -> RopeConfig | None:
        """The first layer's rotary (a family may give layers different ones: FamilySpec.layers)."""
        return self.family.layers[0].rope if self.family.layers else None

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window in positions, None where it attends over the whole context."""
        return self.family.windows

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
        num_kv_heads = int(config.get("num_key_value_heads") or num_heads)
        head_dim = int(config.get("head_dim") or hidden_size // num_heads)
        max_positions = int(config.get("max_position_embeddings", 2048))
        dims = Dimensions(hidden_size=hidden_size, num_layers=values["num_layers"], head_dim=head_dim,
                          max_positions=max_positions)
        return cls(
            model_type=model_type,
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            eos_token_ids=_eos_ids(config, generation or {}),
            family=family_spec(config, dims),
            bos_token_id=_optional_int(config.get("bos_token_id")),
            moe=moe_config(config, values["num_layers"]),
            **values,
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
