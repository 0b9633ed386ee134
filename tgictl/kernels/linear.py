"""The one linear-layer entry point the shard's layers call: torch's matmul, or on CPU for a few rows the
compiled matrix-vector kernel (kernels/native.py, csrc/small_linear.c) and, where the CPU has AMX, for
decode-sized row counts (5-64) the AMX kernel on the weight as stored (csrc/amx_linear.c); where it has
AVX512-BF16 but no AMX (AMD Zen 4 and 5), for 2-32 bf16 rows the VDPBF16PS kernel on the weight as stored
(csrc/dpbf16_linear.c); on AVX2 CPUs where torch's bf16 matmul is its generic loop, every bf16 product of
5+ rows by FMA (csrc/fma_linear.c).

Why: at one to a few rows a linear layer only streams its weights; torch's bf16 matmul reaches a
fraction of the memory bandwidth there, and batch-1 decode spent most of its step in it. At 5-32 rows
torch's matmul re-lays the weight on every call; the AMX kernel reads it as it is, as fast as oneDNN on
its prepacked copy (kernels/prepacked.py) and without a kernel compiled per row count, and the decode
layers' C loop (kernels/decode_layers.py) can call it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from tgictl.kernels.native import load_native_kernels

# Up to this many rows the native kernel wins: every linear of SmolLM2-135M in bf16, weights streamed from
# memory as in a decode step, 2 threads, Sapphire Rapids: 1 row 19 ms against torch's 47, 4 rows 25 against
# 44, 5 rows 37 against 40 (the kernel passes over the weights once per 4 rows); float32 still 1.5x at 8
# rows. Above it oneDNN's matmul, which reuses each weight across rows in registers, is faster.
SMALL_LINEAR_MAX_ROWS: dict[torch.dtype, int] = {torch.bfloat16: 4, torch.float32: 8}
# Except on CPUs with AVX512-BF16 and no AMX (AMD Zen 4 and 5), where the VDPBF16PS kernel takes bf16 from 2 rows:
# it reads each weight pair once per 8 rows and multiplies without widening, while the matrix-vector kernel
# widens every weight and its work per weight grows with the rows. Weights streamed from memory, 2 threads, AMD
# EPYC Zen 4 (2026-12-05): Llama-3.2-1B's 16 layers of projections 65.5 / 74.6 / 95.2 / 114.3 ms at 1-4 rows against VDPBF16PS's 70.8 / 74.0 / 71.9 /
# 71.5; SmolLM2's 30 layers and head 58.6 / 69.2 / 70.3 / 88.5 against 62.0 / 62.1 / 62.3 / 62.6. The 1B's 4-row
# decode step took 150 ms against 99 at 8 rows. AMX CPUs keep 4 (not measured there).
DPBF16_MATRIX_VECTOR_MAX_ROWS = 1
# The AMX kernel's rows (above the matrix-vector range), and up to which it is used even where a weight has
# a packed oneDNN copy: SmolLM2's 120 projections, weights streamed from memory, Sapphire Rapids, 2 threads:
# 5-16 rows 15-17 ms against oneDNN's prepacked 18-22, 32 rows 23 against 24; at 64 rows 43 against 29
# (oneDNN's blocked layout wins once compute counts), but against torch's F.linear on the plain weight
# (50 ms at 64 rows) it still wins, so without a copy it takes up to 64 rows.
AMX_LINEAR_MAX_ROWS = 64
AMX_FIRST_MAX_ROWS = 32
# The VDPBF16PS kernel's rows: SmolLM2's 120 projections, weights streamed from memory, AMD EPYC Zen 5, 2
# threads (scripts/bench_linear.py --many-rows): 8 rows 8.0 ms against oneDNN's prepacked 9.0, 16 rows 8.3
# against 10.4, 32 rows 12.4 against 14.4; at 64 rows 29-35 against 21-23 (and torch's F.linear on the plain
# weight 25-28), so it stops at 32.
DPBF16_LINEAR_MAX_ROWS = 32


@functools.cache
def amx_available() -> bool:
    """Whether this CPU, build and process can run csrc/amx_linear.c."""
    native = load_native_kernels()
    return native is not None and bool(native.amx_linear_available())


@functools.cache
def dpbf16_linear_available() -> bool:
    """Whether this build has csrc/dpbf16_linear.c's kernel (AVX512-BF16)."""
    native = load_native_kernels()
    return native is not None and bool(native.dpbf16_linear_available())


def native_replaces_packed_copy(policy: str) -> bool:
    """Whether, under TGICTL_PREPACK_WEIGHTS=`policy`, weights that the many-row C kernels read as stored
    (dense, int8, GGUF) should keep no oneDNN copy: `auto` where AMX or AVX512-BF16 serve decode-sized row
    counts as fast as oneDNN on its copy (kernels/prepacked.py)."""
    return policy == "auto" and (amx_available() or dpbf16_linear_available())


def native_first(x: Tensor) -> bool:
    """Whether linear() multiplies x with a many-row C kernel that beats a oneDNN copy of the weight at this
    row count (AMX up to 32 rows, VDPBF16PS up to 32), so a weight that has a copy should not use it."""
    rows = x.shape[0]
    return x.device.type == "cpu" and x.dtype == torch.bfloat16 \
        and matrix_vector_max_rows(torch.bfloat16) < rows <= AMX_FIRST_MAX_ROWS \
        and (amx_available() or (rows <= DPBF16_LINEAR_MAX_ROWS and dpbf16_linear_available()))


def uses_amx(x: Tensor) -> bool:
    """Whether linear() multiplies x [rows, in] with the AMX kernel (bf16, 5-64 rows, AMX here); a product
    the kernel declines (an input width not a multiple of 32) still falls back to torch's."""
    return x.device.type == "cpu" and x.dtype == torch.bfloat16 \
        and matrix_vector_max_rows(torch.bfloat16) < x.shape[0] <= AMX_LINEAR_MAX_ROWS and amx_available()


@functools.cache
def matrix_vector_max_rows(dtype: torch.dtype) -> int:
    """Up to how many rows of `dtype` linear() takes the matrix-vector kernel on this CPU (0: never)."""
    if dtype == torch.bfloat16 and dpbf16_linear_available() and not amx_available():
        return DPBF16_MATRIX_VECTOR_MAX_ROWS
    return SMALL_LINEAR_MAX_ROWS.get(dtype, 0)


@functools.cache
def fma_linear_available() -> bool:
    """Whether this build has csrc/fma_linear.c's kernel: AVX2 CPUs on which torch's bf16 matmul is its generic
    loop (~15 GFLOP/s on 2 Zen 3 cores at every row count; the kernel 50-95)."""
    native = load_native_kernels()
    return native is not None and bool(native.fma_linear_available())


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x: [rows, in] -> [rows, out] = x @ weight.T + bias, in x's dtype."""
    if x.device.type == "cpu" and (native := load_native_kernels()) is not None:
        out = None
        rows = x.shape[0]
        if rows <= matrix_vector_max_rows(x.dtype):
            out = native.small_linear(x, weight, bias)
        elif x.dtype == torch.bfloat16:  # the order csrc/decode_layers.c tries them in: a kernel may decline
            if uses_amx(x):
                out = native.amx_linear(x, weight, bias)
            if out is None and rows <= DPBF16_LINEAR_MAX_ROWS and dpbf16_linear_available():
                out = native.dpbf16_linear(x, weight, bias)
            if out is None and fma_linear_available():
                out = native.fma_linear(x, weight, bias)
        if out is not None:
            return out
    return F.linear(x, weight, bias)
