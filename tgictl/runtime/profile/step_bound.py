"""The least time a decode step can take on a machine: the bytes it must stream and the FLOPs it must
do, against the measured DRAM bandwidth and GEMM rate (docs/architecture.md, "Decode step").

A decode step of `batch` sequences with `context` cached tokens each reads every weight once (the
layers' projections and the LM head; the embedding table only for `batch` rows) and every sequence's
cached K/V once, and multiplies each weight with `batch` rows. It can be no faster than the larger of
bytes / bandwidth and FLOPs / GEMM rate: that is the bound a measured step is compared with.
"""

from __future__ import annotations

from dataclasses import dataclass

from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE, kv_bytes_per_head
from tgictl.runtime.profile.model_shape import ModelShape, parameters_per_shard


@dataclass(frozen=True)
class StepBound:
    weight_bytes: int  # weights a step streams
    kv_bytes: int  # cached K/V a step reads
    gemm_flops: int  # weight matmuls of the step (LM head included)
    attention_flops: int  # q·K and p·V over the cached context
    memory_s: float  # (weight + kv bytes) / bandwidth
    compute_s: float  # all FLOPs / GEMM rate

    @property
    def bound_s(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def limited_by(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def streamed_weight_parameters(shape: ModelShape) -> int:
    """Parameters a decode step reads in full: all of them but an untied embedding table (only the
    batch's rows of it are read; tied, the LM head streams it anyway)."""
    total = parameters_per_shard(shape, 1)
    return total if shape.tie_word_embeddings else total - shape.vocab_size * shape.hidden_size


def decode_step_bound(shape: ModelShape, *, batch: int, context: int, dtype_bytes: int,
                      bandwidth_bytes_per_s: float, gemm_flops_per_s: float,
                      kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE, weight_bytes: int | None = None) -> StepBound:
    """The bound of one decode step of `batch` rows over `context` cached tokens each (weights in a
    `dtype_bytes`-wide type, the KV cache in `kv_cache_dtype`'s format: auto is the weights' type, int8 a byte
    per value and a scale per token and head), given the measured bandwidth and GEMM rate. `weight_bytes`: the
    bytes the weights stream when they are not dense (a GGUF file's tensors); dtype_bytes still sizes the KV."""
    if batch < 1 or context < 0 or dtype_bytes < 1 or bandwidth_bytes_per_s <= 0 or gemm_flops_per_s <= 0:
        raise ValueError("batch >= 1, context >= 0, dtype_bytes >= 1 and positive rates are required")
    weights = streamed_weight_parameters(shape)
    per_head = kv_bytes_per_head(kv_cache_dtype, shape.head_dim, dtype_bytes)  # one token's K (or V) of one head
    kv_token = shape.num_layers * 2 * shape.num_kv_heads * per_head
    kv_bytes = batch * context * kv_token
    gemm_flops = 2 * batch * weights
    attention_flops = batch * shape.num_layers * 2 * 2 * shape.num_heads * shape.head_dim * context
    streamed = weights * dtype_bytes if weight_bytes is None else weight_bytes
    return StepBound(
        weight_bytes=streamed,
        kv_bytes=kv_bytes,
        gemm_flops=gemm_flops,
        attention_flops=attention_flops,
        memory_s=(streamed + kv_bytes) / bandwidth_bytes_per_s,
        compute_s=(gemm_flops + attention_flops) / gemm_flops_per_s,
    )
