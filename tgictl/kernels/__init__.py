"""Pure functions on tensors: the paged KV store and attention (reference + fast paths, one dispatch)."""

from tgictl.kernels.attention_fast import decode_attention, prefill_attention
from tgictl.kernels.attention_reference import attention_reference
from tgictl.kernels.dispatch import (
    ATTENTION_BACKENDS,
    DEFAULT_ATTENTION_BACKEND,
    AttentionFn,
    attention,
    get_attention_backend,
)
from tgictl.kernels.kv_store import store_kv
from tgictl.kernels.metadata import (
    AttentionMetadata,
    DecodePlan,
    PrefillPlan,
    build_attention_metadata,
    check_attention_inputs,
)

__all__ = [
    "ATTENTION_BACKENDS",
    "DEFAULT_ATTENTION_BACKEND",
    "AttentionFn",
    "AttentionMetadata",
    "DecodePlan",
    "PrefillPlan",
    "attention",
    "attention_reference",
    "build_attention_metadata",
    "check_attention_inputs",
    "decode_attention",
    "get_attention_backend",
    "prefill_attention",
    "store_kv",
]
