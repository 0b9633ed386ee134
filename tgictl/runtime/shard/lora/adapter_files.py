"""Read and check one PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors).

Every problem is one ConfigError at start-up naming the adapter and what is wrong: a missing file,
a feature PEFT has that the serving path does not (DoRA, trained biases, modules_to_save, per-module
rank or alpha patterns), a target outside the family's decoder projections (q/k/v/o and gate/up/down, or
Phi-3's fused qkv_proj and gate_up_proj: FamilySpec.lora_targets), a rank above MAX_LORA_RANK,
or factors whose shapes do not fit the base model (an adapter trained for another base model).
Scaling is PEFT's: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
(docs/architecture.md, "Multi-LoRA"). A mixture-of-experts model's experts and routers are no target: an adapter
for them is refused by name (docs/moe.md); its attention projections and dense MLP layers are.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from tgictl.errors import ConfigError
from tgictl.runtime.shard.model_config import ModelConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MAX_LORA_RANK = 128

_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# A factor of an MoE expert (Qwen3-MoE's mlp.experts.N.*, Mixtral's block_sparse_moe.experts.N.w1) or router.
_MOE_KEY = re.compile(r"\.layers\.(\d+)\.(?:mlp\.experts\.|mlp\.gate\.|block_sparse_moe\.)")
# PEFT options the serving path would silently ignore; each must be absent or have this value.
_REQUIRED_DEFAULTS: dict[str, Any] = {
    "use_dora": False, "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
    "rank_pattern": {}, "alpha_pattern": {},
}


@dataclass(frozen=True)
class LoraFactors:
    """One projection's factors: a [r, in], b [out, r] (full, unsharded), scaling folded into neither."""

    a: Tensor
    b: Tensor


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: Path
    rank: int
    scaling: float  # lora_alpha / r (or / sqrt(r) with rsLoRA)
    factors: dict[tuple[int, str], LoraFactors]  # (layer, projection) -> factors
    num_bytes: int  # the factors' size as stored in the model's dtype

    @property
    def targets(self) -> frozenset[str]:
        return frozenset(projection for _, projection in self.factors)


def projection_shape(config: ModelConfig, projection: str) -> tuple[int, int]:
    """[out, in] of one decoder projection of the base model (Phi-3's fused ones included)."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    return {
        "q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, q),
        "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter),
        "qkv_proj": (q + 2 * kv, hidden), "gate_up_proj": (2 * inter, hidden),
    }[projection]


def _read_config(name: str, path: Path) -> dict[str, Any]:
    for file_name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (path / file_name).is_file():
            raise ConfigError(f"LoRA adapter {name!r}: {path / file_name} does not exist (a PEFT adapter directory has {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"LoRA adapter {name!r}: cannot read {path / ADAPTER_CONFIG}: {err}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"LoRA adapter {name!r}: {ADAPTER_CONFIG} is not a JSON object (a {type(config).__name__})")
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"LoRA adapter {name!r}: {ADAPTER_CONFIG} is not a LoRA config (peft_type {config.get('peft_type')!r})")
    if config.get("target_parameters"):  # what PEFT adds for an MoE model's MLP targets: the experts' weights
        raise ConfigError(f"LoRA adapter {name!r}: target_parameters={config['target_parameters']!r} (LoRA on the "
                          "weights of MoE experts) is not supported; target the attention projections")
    for key, default in _REQUIRED_DEFAULTS.items():
        value = config.get(key, default)
        if value and value != default:  # absent, empty or the default: nothing ignored
            raise ConfigError(f"LoRA adapter {name!r}: {key}={value!r} is not supported (only {default!r})")
    for key in ("r", "lora_alpha"):
        if not isinstance(config.get(key), (int, float)) or config[key] <= 0:
            raise ConfigError(f"LoRA adapter {name!r}: {ADAPTER_CONFIG} needs a positive {key}, got {config.get(key)!r}")
    return config


def _refuse_expert_target(name: str, key: str, base: ModelConfig) -> None:
    """One line for a factor of an MoE expert or router, or of a dense MLP projection on a sparse layer."""
    if base.moe is None:
        return
    moe_key, match = _MOE_KEY.search(key), _KEY.match(key)
    if moe_key is not None:
        layer = int(moe_key[1])
    elif match is not None and match[2] == "mlp" and int(match[1]) < base.num_layers \
            and base.moe.is_sparse(int(match[1])):
        layer = int(match[1])
    else:
        return
    raise ConfigError(f"LoRA adapter {name!r}: {key!r} targets the mixture of experts of layer {layer}; LoRA on "
                      "experts and routers is not supported (target the attention projections, or the MLP of dense "
                      "layers)")


def read_adapter(name: str, path: Path, base: ModelConfig, dtype: torch.dtype) -> LoraAdapter:
    """The adapter at `path`, checked against the base model `base`, its factors in `dtype` on the CPU."""
    config = _read_config(name, path)
    rank = int(config["r"])
    if rank > MAX_LORA_RANK:
        raise ConfigError(f"LoRA adapter {name!r}: rank {rank} is above the supported {MAX_LORA_RANK}")
    alpha = float(config["lora_alpha"])
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    projections = base.family.lora_targets  # PEFT's module name -> the block holding it
    halves: dict[tuple[int, str], dict[str, Tensor]] = {}
    try:
        with safe_open(str(path / ADAPTER_WEIGHTS), framework="pt", device="cpu") as handle:
            for key in handle.keys():
                match = _KEY.match(key)
                _refuse_expert_target(name, key, base)
                if match is None:
                    raise ConfigError(
                        f"LoRA adapter {name!r}: tensor {key!r} targets no supported module (LoRA may target "
                        f"{', '.join(projections)} of the decoder layers)"
                    )
                layer, block, projection, half = int(match[1]), match[2], match[3], match[4]
                if projections.get(projection) != block:
                    raise ConfigError(f"LoRA adapter {name!r}: unknown target {block}.{projection} in {key!r}; supported: {', '.join(projections)}")
                if layer >= base.num_layers:
                    raise ConfigError(f"LoRA adapter {name!r}: {key!r} is for layer {layer}; the base model has {base.num_layers} layers (a different base model?)")
                halves.setdefault((layer, projection), {})[half] = handle.get_tensor(key).to(dtype)
    except (OSError, RuntimeError, ValueError, SafetensorError) as err:  # a truncated or garbage file
        raise ConfigError(f"LoRA adapter {name!r}: cannot read {path / ADAPTER_WEIGHTS}: {err}") from None
    if not halves:
        raise ConfigError(f"LoRA adapter {name!r}: {path / ADAPTER_WEIGHTS} holds no LoRA factors")
    factors = {}
    for (layer, projection), pair in sorted(halves.items()):
        where = f"layer {layer} {projection}"
        if set(pair) != {"A", "B"}:
            raise ConfigError(f"LoRA adapter {name!r}: {where} has lora_{''.join(pair)} without its pair")
        out, inp = projection_shape(base, projection)
        a, b = pair["A"], pair["B"]
        if a.shape != (rank, inp) or b.shape != (out, rank):
            raise ConfigError(
                f"LoRA adapter {name!r}: {where} has A {list(a.shape)} and B {list(b.shape)}; rank {rank} on the "
                f"base model needs A [{rank}, {inp}] and B [{out}, {rank}] (an adapter for a different base model?)"
            )
        factors[(layer, projection)] = LoraFactors(a, b)
    num_bytes = sum(f.a.numel() * f.a.element_size() + f.b.numel() * f.b.element_size() for f in factors.values())
    return LoraAdapter(name=name, path=path, rank=rank, scaling=scaling, factors=factors, num_bytes=num_bytes)
