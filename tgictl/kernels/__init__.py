"""Pure functions on tensors: the paged KV store and attention (reference + fast paths, one dispatch)."""

from tgictl.kernels.attention_reference import attention_reference
from tgictl.kernels.kv_store import store_kv
from tgictl.kernels.metadata import (
    AttentionMetadata,
    DecodePlan,
    PrefillPlan,
    build_attention_metadata,
    check_attention_inputs,
)

__all__ = [
    "AttentionMetadata",
    "DecodePlan",
    "PrefillPlan",
    "attention_reference",
    "build_attention_metadata",
    "check_attention_inputs",
    "store_kv",
]
