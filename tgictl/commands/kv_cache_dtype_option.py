"""The `--kv-cache-dtype` flag that `shard`, `launch` and `profile` share (docs/kv-cache.md)."""

from __future__ import annotations

import typer

from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE, KV_CACHE_DTYPES

KV_CACHE_DTYPE_OPTION: str = typer.Option(
    DEFAULT_KV_CACHE_DTYPE, "--kv-cache-dtype",
    help=f"The KV cache's format: {', '.join(KV_CACHE_DTYPES)}. auto: the model's dtype; int8: one bf16 scale per "
    "token and KV head, ~1.9x the tokens in the same memory, read by the CPU attention kernels; fp8_e4m3fn / "
    "fp8_e5m2 (TGI's names): cast without a scale, torch ops only (no fp8 arithmetic on CPUs).",
)
