"""A mixture-of-experts family's routing and expert settings, parsed once from config.json into frozen values
(docs/moe.md). The attention and everything else a family does lives in its `FamilySpec` (families.py); this is
only what replaces the MLP, so a dense family has `ModelConfig.moe is None`.

Both families served here route alike: router logits = x W_r^T, softmax over all experts in float32, the top-k
experts by probability, their probabilities renormalised to sum to one where the family says so; a token's output
is the sum of its experts' gated MLPs, each scaled by its probability. They differ in names, in which layers are
sparse and in the dtype of the routing weights. Anything else a config asks of its router (shared experts, grouped
top-k, sigmoid scores, a scaling factor) is refused by name: served without it, outputs would silently differ.
Torch-free: `tgictl profile` sizes the experts from the same values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tgictl.errors import ConfigError, UnsupportedModelError


@dataclass(frozen=True)
class ExpertNames:
    """Checkpoint names of a sparse block under its layer's prefix: `{layer}.{block}.{router}.weight` [E, hidden]
    and `{layer}.{block}.experts.{e}.{gate|up|down}.weight` (transformers' save_pretrained writes every family's
    experts one by one; GGUF stacks them, runtime/shard/gguf_file.py maps the names)."""

    block: str  # the sparse block's module name
    gate: str  # expert e's gate projection [I, hidden]
    up: str  # its up projection [I, hidden]
    down: str  # its down projection [hidden, I]
    router: str = "gate"

    def expert(self, layer_prefix: str, expert: int, projection: str) -> str:
        return f"{layer_prefix}.{self.block}.experts.{expert}.{projection}.weight"


MIXTRAL_NAMES = ExpertNames(block="block_sparse_moe", gate="w1", up="w3", down="w2")
QWEN_MOE_NAMES = ExpertNames(block="mlp", gate="gate_proj", up="up_proj", down="down_proj")


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int  # experts per token
    expert_intermediate_size: int  # each expert's MLP width
    normalize_top_k: bool  # the top-k probabilities divided by their sum (Mixtral always; Qwen3-MoE: norm_topk_prob)
    # Mixtral multiplies the experts' outputs by float32 routing weights; Qwen3-MoE rounds them to the activations'
    # dtype first (transformers' routers). Equal in float32; different roundings in bf16.
    weights_in_float32: bool
    sparse_layers: tuple[bool, ...]  # per layer: an MoE block (True) or the dense MLP of `intermediate_size`
    names: ExpertNames

    def is_sparse(self, layer: int) -> bool:
        return self.sparse_layers[layer]

    @property
    def num_sparse_layers(self) -> int:
        return sum(self.sparse_layers)

    def expert_parameters(self, hidden_size: int) -> int:
        """Weights of one expert (gate, up and down): every expert is held in memory."""
        return 3 * hidden_size * self.expert_intermediate_size


# Router and expert settings of other MoE families: present with a value other than the one that means "off",
# they change outputs in a way neither family here computes.
_OFF_VALUES: Mapping[str, tuple[Any, ...]] = MappingProxyType({
    "shared_expert_intermediate_size": (None, 0),  # Qwen2-MoE's shared expert
    "n_shared_experts": (None, 0),  # DeepSeek
    "num_shared_experts": (None, 0),
    "routed_scaling_factor": (None, 1, 1.0),
    "scoring_func": (None, "softmax"),
    "topk_method": (None, "greedy"),
    "n_group": (None, 1),
    "topk_group": (None, 1),
    "first_k_dense_replace": (None, 0),
    "moe_layer_freq": (None, 1),
    "use_routing_bias": (None, False),
    "router_bias": (None, False),
    "moe_shared_expert_intermediate_size": (None, 0),
})


def _positive(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if value is None:
        raise ConfigError(f"config.json is missing {key!r}")
    if int(value) < 1:
        raise ConfigError(f"{key} must be at least 1, got {value!r}")
    return int(value)


def _experts(config: Mapping[str, Any]) -> int:
    # transformers 5 writes num_local_experts for both families (an attribute map); Qwen's files say num_experts.
    key = "num_experts" if config.get("num_experts") is not None else "num_local_experts"
    return _positive(config, key)


def _top_k(config: Mapping[str, Any], experts: int) -> int:
    top_k = _positive(config, "num_experts_per_tok")
    if top_k > experts:
        raise ConfigError(f"num_experts_per_tok ({top_k}) is more than the {experts} experts")
    return top_k


def mixtral(config: Mapping[str, Any], num_layers: int) -> MoEConfig:
    experts = _experts(config)
    return MoEConfig(num_experts=experts, top_k=_top_k(config, experts),
                     expert_intermediate_size=_positive(config, "intermediate_size"), normalize_top_k=True,
                     weights_in_float32=True, sparse_layers=(True,) * num_layers, names=MIXTRAL_NAMES)


def qwen3_moe(config: Mapping[str, Any], num_layers: int) -> MoEConfig:
    """transformers' Qwen3MoeDecoderLayer: layer i is sparse unless listed in mlp_only_layers, and only every
    decoder_sparse_step-th layer ((i + 1) % step == 0)."""
    experts = _experts(config)
    step = int(config.get("decoder_sparse_step") or 1)
    if step < 1:
        raise ConfigError(f"decoder_sparse_step must be at least 1, got {config.get('decoder_sparse_step')!r}")
    dense = config.get("mlp_only_layers") or []
    if not isinstance(dense, list) or any(not isinstance(i, int) or not 0 <= i < num_layers for i in dense):
        raise ConfigError(f"mlp_only_layers must list layer indices below {num_layers}, got {dense!r}")
    sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))
    return MoEConfig(num_experts=experts, top_k=_top_k(config, experts),
                     expert_intermediate_size=_positive(config, "moe_intermediate_size"),
                     normalize_top_k=bool(config.get("norm_topk_prob", False)), weights_in_float32=False,
                     sparse_layers=sparse, names=QWEN_MOE_NAMES)


MoEBuilder = Callable[[Mapping[str, Any], int], MoEConfig]
MOE_FAMILIES: Mapping[str, MoEBuilder] = MappingProxyType({"mixtral": mixtral, "qwen3_moe": qwen3_moe})


def moe_config(config: Mapping[str, Any], num_layers: int) -> MoEConfig | None:
    """The MoE settings of config's family, None for a dense family; UnsupportedModelError naming a router or
    expert setting the family's transformers code does not have."""
    builder = MOE_FAMILIES.get(str(config.get("model_type")))
    if builder is None:
        return None
    for key, off in _OFF_VALUES.items():
        if key in config and config[key] not in off:
            raise UnsupportedModelError(f"{key}={config[key]!r} is not supported (model_type "
                                        f"{config.get('model_type')!r}: its router has no such setting)")
    return builder(config, num_layers)
