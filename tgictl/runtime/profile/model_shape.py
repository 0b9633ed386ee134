"""A model's dimensions, read from config.json, and what follows from them per shard without loading weights:
the heads each shard holds, its parameters by kind, its weights' bytes in every format, FLOPs and activation
bytes per token. budgets.py turns these into serving budgets; step_bound.py and `tgictl profile` read them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tgictl.errors import ConfigError
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.profile.family_shape import FamilyShape, family_shape
from tgictl.runtime.shard.moe_config import moe_config
from tgictl.runtime.tensor_parallel import HeadSplit, head_splits


@dataclass(frozen=True)
class ModelShape:
    """The dimensions budgets need, read from config.json (the text part of a VLM config)."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # per expert for MoE models
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    num_experts: int  # 1 for dense models
    experts_per_token: int  # 1 for dense models
    shared_experts: int
    is_vlm: bool
    family: FamilyShape = FamilyShape()  # norms, biases, sliding windows (family_shape.py)
    # Layers of an MoE model whose MLP is one dense MLP of dense_intermediate_size instead of the experts
    # (Qwen3-MoE's mlp_only_layers and decoder_sparse_step; runtime/shard/moe_config.py says which).
    dense_mlp_layers: int = 0
    dense_intermediate_size: int = 0

    @property
    def sparse_layers(self) -> int:
        """Layers whose MLP is the experts (every layer of a dense model, as one expert)."""
        return self.num_layers - self.dense_mlp_layers


def _int(config: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"config.json field {key} must be a non-negative integer, got {value!r}")
            return value
    if default is None:
        raise ConfigError(f"config.json lacks {' / '.join(keys)}")
    return default


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    """Read a transformers config dict. Missing essentials raise ConfigError naming the field."""
    is_vlm = "vision_config" in config
    text = config.get("text_config") or config
    hidden = _int(text, "hidden_size", "n_embd", "d_model")
    heads = _int(text, "num_attention_heads", "n_head")
    if heads == 0:
        raise ConfigError("config.json num_attention_heads must be positive")
    head_dim = _int(text, "head_dim", default=hidden // heads)
    kv_heads = _int(text, "num_key_value_heads", default=heads)
    if kv_heads == 0:
        raise ConfigError("config.json num_key_value_heads must be positive")
    num_experts = _int(text, "num_local_experts", "num_experts", "n_routed_experts", default=1)
    moe = num_experts > 1
    inter_keys = ("moe_intermediate_size", "intermediate_size") if moe else ("intermediate_size",)
    num_layers = _int(text, "num_hidden_layers", "n_layer")
    served_moe = moe_config(text, num_layers) if moe else None  # the families the shard serves: their layers
    dense_layers = 0 if served_moe is None else num_layers - served_moe.num_sparse_layers
    return ModelShape(
        model_type=str(config.get("model_type", "")),
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_int(text, *inter_keys, default=4 * hidden),
        vocab_size=_int(text, "vocab_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        max_position_embeddings=text.get("max_position_embeddings"),
        num_experts=num_experts,
        experts_per_token=_int(text, "num_experts_per_tok", default=1) if moe else 1,
        shared_experts=_int(text, "n_shared_experts", default=0),
        is_vlm=is_vlm,
        family=family_shape(config, text, num_layers, hidden, head_dim),
        dense_mlp_layers=dense_layers,
        dense_intermediate_size=_int(text, "intermediate_size", default=4 * hidden) if dense_layers else 0,
    )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def attention_split(shape: ModelShape, num_shard: int) -> tuple[HeadSplit, ...]:
    """Each shard's heads by the shard's own rule (KV-head groups as evenly as possible); raises
    UnsupportedModelError for a shard count the model cannot be split over."""
    return head_splits(shape.num_heads, shape.num_kv_heads, num_shard)


def kv_heads_per_shard(shape: ModelShape, num_shard: int) -> int:
    """KV heads of the shard holding the most: every shard's cache gets as many blocks as the most
    loaded one can hold (the router takes the smallest warmup figure)."""
    return max(split.kv_count for split in attention_split(shape, num_shard))


@dataclass(frozen=True)
class ParameterCounts:
    """One shard's parameters by what they are, which decides their bytes under --quantize."""

    projections: tuple[tuple[int, int], ...]  # (input features, parameters) per kind of projection
    vocab: int  # embedding rows, plus the LM head's when untied
    other: int  # norms, biases, the MoE router
    float32: int = 0  # of `other`: the norms a family's shard keeps in float32 (Gemma's, OLMo2's)

    @property
    def total(self) -> int:
        return sum(count for _, count in self.projections) + self.vocab + self.other


def parameter_counts(shape: ModelShape, num_shard: int) -> ParameterCounts:
    """Parameters of the largest shard (rank 0, which the even splits give the larger parts; see
    docs/architecture.md, "Decisions": Tensor parallelism): attention by KV-head groups, MLP by
    columns, vocab-parallel embedding and LM head (padded up to a multiple of num_shard); norms and the
    MoE router are replicated."""
    h, n, layers = shape.hidden_size, num_shard, shape.num_layers
    first = attention_split(shape, n)[0]
    q_cols = first.q_count * shape.head_dim
    kv_cols = first.kv_count * shape.head_dim
    # Every expert's intermediate features are split over the shards, as a dense MLP's are (docs/moe.md), so each
    # shard holds a slice of every expert; a dense layer of an MoE model has its own width.
    inter = _ceil_div(shape.intermediate_size, n)
    dense_inter = _ceil_div(shape.dense_intermediate_size, n)
    sparse, dense = shape.sparse_layers, shape.dense_mlp_layers
    mlp_columns = sparse * inter * (shape.num_experts + shape.shared_experts) + dense * dense_inter
    projections = (
        (h, layers * h * (q_cols + 2 * kv_cols) + 2 * h * mlp_columns),  # q, k, v, gate, up: read hidden
        (q_cols, layers * q_cols * h),  # o
        (inter, sparse * inter * h * (shape.num_experts + shape.shared_experts)),  # down
    ) + (((dense_inter, dense * dense_inter * h),) if dense else ())  # the dense layers' down
    family = shape.family
    bias = (q_cols + 2 * kv_cols if family.qkv_bias else 0) + (h if family.o_bias else 0) \
        + (2 * inter + h if family.mlp_bias else 0)
    qk_norm = {"per_head": 2 * shape.head_dim, "full_width": q_cols + kv_cols}.get(family.qk_norm, 0)
    norms = layers * (family.norms_per_layer * h + qk_norm) + h  # the layers' norms, the final norm
    router = h * shape.num_experts if shape.num_experts > 1 else 0
    vocab = _ceil_div(shape.vocab_size, n) * h
    return ParameterCounts(
        projections=projections,
        vocab=vocab if shape.tie_word_embeddings else 2 * vocab,
        other=layers * bias + sparse * router + norms,  # biases, the routers, the norms
        float32=norms if family.norms_in_float32 else 0,
    )


def parameters_per_shard(shape: ModelShape, num_shard: int) -> int:
    return parameter_counts(shape, num_shard).total


def weight_bytes_per_shard(
    shape: ModelShape, num_shard: int, dtype_bytes: int, quantize: QuantizeSpec | None, gguf_tensor_bytes: int | None
) -> tuple[int, str]:
    """(bytes, source) of the largest shard's weights: dense in the serving dtype, --quantize's formats
    (docs/architecture.md, "Weight formats"), or a GGUF file's own tensor bytes."""
    counts = parameter_counts(shape, num_shard)
    if gguf_tensor_bytes is not None:
        share = counts.total / parameters_per_shard(shape, 1)
        return int(gguf_tensor_bytes * share), "the GGUF file's tensor bytes × this shard's share of the parameters"
    float32_extra = counts.float32 * (4 - dtype_bytes)  # the norms the shard keeps in float32 (Gemma, OLMo2)
    if quantize is None:
        size = counts.total * dtype_bytes + float32_extra
        return size, f"parameters per shard from config.json × {dtype_bytes} bytes"
    size = sum(count * quantize.projection_bytes(features, dtype_bytes) for features, count in counts.projections)
    size += counts.vocab * quantize.vocab_bytes(shape.hidden_size, dtype_bytes) + counts.other * dtype_bytes
    size += float32_extra
    return int(size), f"{quantize.label} projections, int8 embedding and LM head, the rest × {dtype_bytes} bytes"


def model_flops_per_token(shape: ModelShape) -> int:
    """TGI's launcher formula (§4.3): per layer 2·H·hd·(heads [q] + kv [k] + kv [v] + heads [attn] +
    heads [o]) + 2·3·H·inter·(experts_per_token + shared_experts) for the gated MLP; for an MoE model only the
    experts a token is routed to count, plus the router's 2·H·experts, and a dense layer's MLP its own width."""
    h, hd = shape.hidden_size, shape.head_dim
    attention = 2 * h * hd * (3 * shape.num_heads + 2 * shape.num_kv_heads)
    experts = 2 * 3 * h * shape.intermediate_size * (shape.experts_per_token + shape.shared_experts)
    router = 2 * h * shape.num_experts if shape.num_experts > 1 else 0
    dense = 2 * 3 * h * shape.dense_intermediate_size
    return shape.num_layers * attention + shape.sparse_layers * (experts + router) + shape.dense_mlp_layers * dense


def activation_bytes_per_token(shape: ModelShape, num_shard: int, dtype_bytes: int) -> int:
    """Prefill activations alive at the MLP peak, per token and shard: the residual stream and its normed
    copy (2·H) plus the gate/up output and the activated product (3·inter/N per routed expert, or of the
    widest dense layer). Logits exist only for the last token of each request, so they are left out."""
    inter = _ceil_div(shape.intermediate_size, num_shard) * (shape.experts_per_token + shape.shared_experts)
    inter = max(inter, _ceil_div(shape.dense_intermediate_size, num_shard))
    return (2 * shape.hidden_size + 3 * inter) * dtype_bytes
