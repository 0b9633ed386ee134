"""What `--kv-cache-dtype` means, as the shard, the launcher and `tgictl profile` all need it: the formats and how
many bytes a cached token takes per KV head. Pure Python, no torch (docs/kv-cache.md); the storage itself lives in
tgictl/kernels/kv_pages.py.

- auto: the model's dtype (bf16 or float32), exact.
- int8: every cached K or V row of one head (head_dim values of one token) scaled into [-127, 127] by its own
  bf16 scale, amax / 127; head_dim + 2 bytes per token and head, so a bf16 cache holds 2 * head_dim / (head_dim + 2)
  times as many tokens in the same memory (1.94x at head_dim 64, 1.97x at 128). The kernels read it on the
  CPU (csrc/kv_int8.h and the attention kernels that include it).
- fp8_e4m3fn, fp8_e5m2: TGI's names; the values cast to torch's float8 types without a scale (TGI's default
  scale of 1: e4m3 saturates at +-448, e5m2 clamps to +-57,344), head_dim bytes. CPUs have no fp8 arithmetic,
  so these run on torch ops, gathering and widening each step: for GPUs and for comparison; int8 is the
  CPU's format.
"""

from __future__ import annotations

from tgictl.errors import ConfigError

KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "int8", "fp8_e4m3fn", "fp8_e5m2")
DEFAULT_KV_CACHE_DTYPE = "auto"
INT8_SCALE_BYTES = 2  # one bf16 scale per token and KV head


def check_kv_cache_dtype(name: str) -> str:
    """`name` when it is a known format; a ConfigError naming the flag otherwise."""
    if name not in KV_CACHE_DTYPES:
        raise ConfigError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {name!r}")
    return name


def kv_bytes_per_head(kv_cache_dtype: str, head_dim: int, model_dtype_bytes: int) -> int:
    """Bytes one token's K (or V) of one KV head takes in the cache."""
    check_kv_cache_dtype(kv_cache_dtype)
    if kv_cache_dtype == "auto":
        return head_dim * model_dtype_bytes
    if kv_cache_dtype == "int8":
        return head_dim + INT8_SCALE_BYTES
    return head_dim


def describe(kv_cache_dtype: str) -> str:
    """How `profile` and the logs name a format's per-head size."""
    if kv_cache_dtype == "int8":
        return f"int8 values + a {INT8_SCALE_BYTES}-byte scale per token and head"
    if kv_cache_dtype == "auto":
        return "the model's dtype"
    return f"{kv_cache_dtype} values, no scale"
