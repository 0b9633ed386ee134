"""Compiled CPU kernels: C sources shipped in the package, built once per machine, loaded with ctypes.

Why C: decode attention through torch ops copies every sequence's K/V out of the paged cache in
every layer and runs batched matmuls of a few rows each (far below the matmul kernels' speed); the C
kernel (csrc/paged_decode.c) reads the cache in place. Why not a torch C++ extension: building one
needs torch's headers and ninja and takes about a minute; this builds in about a second with the C
compiler alone and needs nothing from the network.

The library is compiled with -march=native into tgictl's cache directory under a name that hashes
the source, the compiler's version and this CPU's flags, written under a temporary name and renamed,
so concurrent shards and a home directory shared by different machines are safe. When there is no
compiler, the build fails, or TGICTL_NATIVE_KERNELS=0, `load_native_kernels` returns None (with one
warning saying why) and callers keep the pure-torch path.

OpenMP: the library links libgomp.so.1, the runtime torch's CPU wheels load under that same name, so
the process keeps one OpenMP thread pool; the caller passes torch's thread count explicitly.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from tgictl.env import read_env
from tgictl.kernels.kv_pages import Int8Pages

log = logging.getLogger(__name__)

# Every C file of csrc/ goes into one library (the quantized linears bind theirs from it in
# linear_methods/native.py); the headers only join the build's hash.
_CSRC = Path(__file__).with_name("csrc")
_SOURCES = tuple(sorted(_CSRC.glob("*.c")))
_HEADERS = tuple(sorted(_CSRC.glob("*.h")))
# Reassociation lets the dot products and sums vectorise (the kernel has no order-sensitive sums
# beyond float rounding); -ffp-contract=fast gives fused multiply-adds, which -std=c11 turns off;
# no -ffast-math: infinities and NaN keep their meaning.
_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=fast", "-fno-math-errno", "-fassociative-math",
          "-fno-signed-zeros", "-fno-trapping-math", "-shared", "-fPIC", "-std=c11")
_BUILD_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class NativeKernels:
    """The loaded library's entry points (ctypes functions)."""

    path: Path
    library: ctypes.CDLL  # every entry point, for the modules that bind their own (linear_methods/native.py)
    decode_f32: ctypes._CFuncPtr  # type: ignore[name-defined]
    decode_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    linear_f32: ctypes._CFuncPtr  # type: ignore[name-defined]
    linear_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    # Collectives over a shared-memory segment (runtime/shard/shm_collectives.py calls them).
    shm_register: ctypes._CFuncPtr  # type: ignore[name-defined]
    shm_all_reduce: ctypes._CFuncPtr  # type: ignore[name-defined]
    shm_all_gather: ctypes._CFuncPtr  # type: ignore[name-defined]
    # The decoder's fused elementwise steps and the greedy choice (kernels/fused.py calls them).
    rmsnorm_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    silu_mul_f32: ctypes._CFuncPtr  # type: ignore[name-defined]
    silu_mul_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    rotary_store_f32: ctypes._CFuncPtr  # type: ignore[name-defined]
    rotary_store_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    greedy_f32: ctypes._CFuncPtr  # type: ignore[name-defined]
    greedy_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    topk_values_f32: ctypes._CFuncPtr  # type: ignore[name-defined]  # the sampler's top_k / top_p (csrc/topk_values.c)
    # A decode step's plain decoder layers in one call (kernels/decode_layers.py calls them).
    decode_layers_scratch: ctypes._CFuncPtr  # type: ignore[name-defined]
    decode_layers_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    # bf16 linears of 5-64 rows with AMX on the weight as stored (csrc/amx_linear.c).
    amx_linear_available: ctypes._CFuncPtr  # type: ignore[name-defined]
    amx_linear_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    # Causal prefill attention in bf16 with AVX512-BF16 (csrc/prefill_attention_bf16.c).
    prefill_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    # The same with AMX tiles where the CPU and process have them (csrc/prefill_attention_amx.c).
    prefill_amx: ctypes._CFuncPtr  # type: ignore[name-defined]
    # bf16 linears of 5+ rows by FMA on widened weights, where torch has no fast bf16 matmul (csrc/fma_linear.c).
    fma_linear_available: ctypes._CFuncPtr  # type: ignore[name-defined]
    fma_linear_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    # bf16 linears of 5-64 rows by VDPBF16PS on the weight as stored, on AVX512-BF16 CPUs (csrc/dpbf16_linear.c).
    dpbf16_linear_available: ctypes._CFuncPtr  # type: ignore[name-defined]
    dpbf16_linear_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    # An int8 KV cache (--kv-cache-dtype int8): the rotary + store kernel writing int8 rows and their scales
    # (csrc/fused_layers.c), decode attention reading them (csrc/decode_attention_q8.c), prefill attention
    # widening them as it lays them out (csrc/prefill_attention_bf16.c).
    rotary_store_q8_f32: ctypes._CFuncPtr  # type: ignore[name-defined]
    rotary_store_q8_bf16: ctypes._CFuncPtr  # type: ignore[name-defined]
    decode_q8: ctypes._CFuncPtr  # type: ignore[name-defined]
    prefill_q8: ctypes._CFuncPtr  # type: ignore[name-defined]

    def small_linear(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
        """x @ weight.T + bias for a few rows x [m, k] (weight [n, k]); [m, n] in x's dtype.

        None when this call cannot run natively (another dtype or device, non-contiguous weight).
        """
        if weight.dtype not in (torch.float32, torch.bfloat16) or weight.device.type != "cpu" \
                or not weight.is_contiguous() or x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16):
            return None
        m, k = x.shape
        n = weight.shape[0]
        b32 = None if bias is None else bias.float().contiguous()
        bias_ptr = None if b32 is None else b32.data_ptr()
        if weight.dtype == torch.bfloat16:  # reads x and writes y in x's dtype: nothing to convert
            x = x.contiguous()
            y = torch.empty(m, n, dtype=x.dtype)
            is_bf16 = x.dtype == torch.bfloat16
            status = self.linear_bf16(x.data_ptr(), is_bf16, weight.data_ptr(), bias_ptr, y.data_ptr(), is_bf16,
                                      m, n, k, torch.get_num_threads())
            return y if status == 0 else None
        x32 = x.float().contiguous()  # [m, k]: a few rows, converted once
        y = torch.empty(m, n, dtype=torch.float32)
        self.linear_f32(x32.data_ptr(), weight.data_ptr(), bias_ptr, y.data_ptr(), m, n, k, torch.get_num_threads())
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def amx_linear(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
        """x [m, k] @ weight.T + bias with AMX for bf16 x and weight [n, k] (k a multiple of 32); [m, n] bf16.

        None where this CPU, build or process has no AMX, or the input does not fit (the caller takes oneDNN).
        """
        return _bf16_weight_product(self.amx_linear_bf16, x, weight, bias)

    def fma_linear(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
        """x [m, k] @ weight.T + bias by FMA for bf16 x and weight [n, k] (k a multiple of 16); [m, n] bf16.

        None where this build has no such kernel (it is built only where torch's bf16 matmul is its generic
        loop: AVX2 without AVX512-BW or AVX-NE-CONVERT) or the input does not fit (the caller takes torch's).
        """
        return _bf16_weight_product(self.fma_linear_bf16, x, weight, bias)

    def dpbf16_linear(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
        """x [m, k] @ weight.T + bias by VDPBF16PS for bf16 x of 1-64 rows and weight [n, k] (k even); [m, n] bf16.

        None where this build lacks AVX512-BF16 or the input does not fit (the caller takes another kernel).
        """
        return _bf16_weight_product(self.dpbf16_linear_bf16, x, weight, bias)

    def prefill_attention(self, query: Tensor, key_cache: Tensor, value_cache: Tensor, slots: Tensor,
                          cache_len: int, scale: float, window: int | None = None) -> Tensor | None:
        """Causal attention of one sequence's new tokens query [new_len, heads, d] (bf16) at positions
        cache_len .. over the paged caches [blocks, block_size, kv_heads, d] at `slots` [cache_len + new_len];
        with `window`, query j sees only the keys after cache_len + j - window (a sliding window).

        AMX tiles where the CPU and process have them (2.3x the AVX512-BF16 kernel at 1,000 tokens on an AMX
        Xeon; it declines a window), else AVX512-BF16. None where neither serves this build or shape (head size
        not 64 or 128, another dtype): the caller takes SDPA.
        """
        return self.prefill_attention_with((self.prefill_amx, self.prefill_bf16), query, key_cache, value_cache,
                                           slots, cache_len, scale, window)

    def prefill_attention_with(self, kernels: Sequence[Callable[..., int]], query: Tensor, key_cache: Tensor,
                               value_cache: Tensor, slots: Tensor, cache_len: int, scale: float,
                               window: int | None = None) -> Tensor | None:
        """`prefill_attention` by the first of `kernels` (prefill_amx, prefill_bf16) that takes the call; None
        where none does. Each writes all of `out` when it succeeds."""
        tensors = (query, key_cache, value_cache)
        if any(t.dtype != torch.bfloat16 or t.device.type != "cpu" or not t.is_contiguous() for t in tensors) \
                or slots.dtype != torch.int64 or not slots.is_contiguous():
            return None
        new_len, heads, d = query.shape
        out = torch.empty_like(query)
        for kernel in kernels:
            if kernel(query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), slots.data_ptr(), cache_len,
                      new_len, heads, key_cache.shape[2], d, scale, window or 0, out.data_ptr(),
                      torch.get_num_threads()) == 0:
                return out
        return None

    def paged_decode(self, query: Tensor, key_cache: Tensor, value_cache: Tensor, slots: Tensor,
                     context_lens: Tensor, max_len: int, scale: float, softcap: float | None) -> Tensor | None:
        """Decode attention for query [n, heads, d] over the paged caches [blocks, block_size, kv_heads, d].

        slots: [n * max_len] int64 flat slots per sequence (row-major); context_lens: [n] int64.
        Returns [n, heads, d] in query's dtype, or None when this call cannot run natively (another
        dtype or device, a non-contiguous input, scratch memory refused): the caller uses torch.
        """
        dtype = query.dtype
        if dtype not in (torch.float32, torch.bfloat16) or query.device.type != "cpu":
            return None
        if key_cache.dtype != dtype or value_cache.dtype != dtype:
            return None
        tensors = (query, key_cache, value_cache, slots, context_lens)
        if not all(t.is_contiguous() for t in tensors) or slots.dtype != torch.int64 \
                or context_lens.dtype != torch.int64:
            return None
        n, heads, d = query.shape
        kv_heads = key_cache.shape[2]
        out = torch.empty_like(query)
        fn = self.decode_f32 if dtype == torch.float32 else self.decode_bf16
        status = fn(query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), slots.data_ptr(),
                    context_lens.data_ptr(), n, max_len, heads, kv_heads, d, scale,
                    0.0 if softcap is None else softcap, out.data_ptr(), torch.get_num_threads())
        return out if status == 0 else None


def paged_decode_int8(native: NativeKernels, query: Tensor, key_cache: Int8Pages, value_cache: Int8Pages,
                      slots: Tensor, context_lens: Tensor, max_len: int, scale: float, softcap: float | None,
                      portable: bool = False) -> Tensor | None:
    """`NativeKernels.paged_decode` over int8 caches (csrc/decode_attention_q8.c): query [n, heads, d] bf16 or
    float32, the output in its dtype. `portable` takes the loop every CPU runs (the tests compare both). None when
    the inputs are not that or memory is refused."""
    tensors = (query, key_cache.values, key_cache.scales, value_cache.values, value_cache.scales, slots, context_lens)
    if query.dtype not in (torch.float32, torch.bfloat16) or any(t.device.type != "cpu" for t in tensors) \
            or not all(t.is_contiguous() for t in tensors) or slots.dtype != torch.int64 \
            or context_lens.dtype != torch.int64:
        return None
    n, heads, d = query.shape
    out = torch.empty_like(query)
    status = native.decode_q8(query.data_ptr(), int(query.dtype == torch.bfloat16), key_cache.values.data_ptr(),
                              key_cache.scales.data_ptr(), value_cache.values.data_ptr(), value_cache.scales.data_ptr(),
                              slots.data_ptr(), context_lens.data_ptr(), n, max_len, heads, key_cache.shape[2], d,
                              scale, 0.0 if softcap is None else softcap, out.data_ptr(), torch.get_num_threads(),
                              int(portable))
    return out if status == 0 else None


def prefill_attention_int8(native: NativeKernels, query: Tensor, key_cache: Int8Pages, value_cache: Int8Pages,
                           slots: Tensor, cache_len: int, scale: float, window: int | None = None) -> Tensor | None:
    """`NativeKernels.prefill_attention` over int8 caches (csrc/prefill_attention_bf16.c's int8 entry): query
    [new_len, heads, d] bf16, each cached row widened to bf16 as gather_rows does. None where the inputs are not
    that, the build or shape is not served (no AVX512-BF16, head size not 64 or 128) or memory is refused."""
    tensors = (query, key_cache.values, key_cache.scales, value_cache.values, value_cache.scales, slots)
    if query.dtype != torch.bfloat16 or any(t.device.type != "cpu" for t in tensors) \
            or not all(t.is_contiguous() for t in tensors) or slots.dtype != torch.int64:
        return None
    new_len, heads, d = query.shape
    out = torch.empty_like(query)
    status = native.prefill_q8(query.data_ptr(), key_cache.values.data_ptr(), key_cache.scales.data_ptr(),
                               value_cache.values.data_ptr(), value_cache.scales.data_ptr(), slots.data_ptr(),
                               cache_len, new_len, heads, key_cache.shape[2], d, scale, window or 0, out.data_ptr(),
                               torch.get_num_threads())
    return out if status == 0 else None


def _bf16_weight_product(kernel: Callable[..., int], x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
    """x [m, k] @ weight.T + bias by a C kernel taking (x, weight, bias, y, m, n, k, threads) on bf16 x and a
    bf16 weight [n, k] on the CPU; None where the inputs are not that or the kernel declines."""
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 or x.device.type != "cpu" \
            or weight.device.type != "cpu" or not weight.is_contiguous() or x.dim() != 2:
        return None
    n, k = weight.shape[0], x.shape[1]
    return bf16_product(x, n, bias, lambda x_ptr, bias_ptr, y_ptr, m: kernel(
        x_ptr, weight.data_ptr(), bias_ptr, y_ptr, m, n, k, torch.get_num_threads()))


def bf16_product(x: Tensor, n: int, bias: Tensor | None,
                 call: Callable[[int, int | None, int, int], int]) -> Tensor | None:
    """y [m, n] bf16 from a C product that reads x [m, k] bf16 and a float32 bias and writes y:
    call(x_ptr, bias_ptr or None, y_ptr, m) -> status; None unless the status is 0."""
    x = x.contiguous()
    b32 = None if bias is None else bias.float().contiguous()
    y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
    status = call(x.data_ptr(), None if b32 is None else b32.data_ptr(), y.data_ptr(), x.shape[0])
    return y if status == 0 else None


def _compiler_identity(compiler: str) -> str:
    result = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30, check=True)
    return result.stdout.splitlines()[0] if result.stdout else compiler


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def _build(compiler: str, cache_dir: Path, march: str = "native", extra_flags: tuple[str, ...] = ()) -> Path:
    """The library for `-march=MARCH` (native: this CPU; tests also build e.g. haswell, x86-64, and
    sapphirerapids without AMX, as AMD Zen 4 has it) and any `extra_flags`."""
    flags = (f"-march={march}", *extra_flags, *_FLAGS)
    sources = [path.read_bytes() for path in (*_SOURCES, *_HEADERS)]
    key = hashlib.sha256(b"\0".join([*sources, _compiler_identity(compiler).encode(), cpu_flags().encode(),
                                     " ".join(flags).encode()])).hexdigest()[:16]
    target = cache_dir / f"tgictl-kernels-{key}.so"
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        partial = Path(tmp) / target.name
        result = subprocess.run([compiler, *flags, "-o", str(partial), *map(str, _SOURCES)], capture_output=True,
                                text=True, timeout=_BUILD_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[:500]}")
        os.replace(partial, target)  # atomic: another process sees no file or the whole one
    return target


def _bind(path: Path) -> NativeKernels:
    library = ctypes.CDLL(str(path))
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    functions = []
    c_int, u64, f64 = ctypes.c_int, ctypes.c_uint64, ctypes.c_double
    decode = [p, p, p, p, p, i64, i64, i64, i64, i64, f32, f32, p, c_int]
    prefill = [p, p, p, p, i64, i64, i64, i64, i64, f32, i64, p, c_int]  # csrc/prefill_attention.h
    signatures = {
        "tgictl_shm_register": [p, c_int, i64],
        "tgictl_shm_all_reduce": [p, c_int, c_int, i64, u64, p, i64, c_int, f64],
        "tgictl_shm_all_gather": [p, c_int, c_int, i64, u64, p, i64, p, f64],
    }
    # In NativeKernels' field order.
    kernels: dict[str, tuple[list[type], type | None]] = {
        "tgictl_paged_decode_f32": (decode, c_int),
        "tgictl_paged_decode_bf16": (decode, c_int),
        "tgictl_small_linear_f32": ([p, p, p, p, i64, i64, i64, c_int], None),
        "tgictl_small_linear_bf16": ([p, c_int, p, p, p, c_int, i64, i64, i64, c_int], c_int),
        **{name: (argtypes, c_int) for name, argtypes in signatures.items()},
        "tgictl_rmsnorm_bf16": ([p, p, p, p, p, i64, i64, f32, c_int], None),
        "tgictl_silu_mul_f32": ([p, p, i64, i64, c_int], None),
        "tgictl_silu_mul_bf16": ([p, p, i64, i64, c_int], None),
        "tgictl_rotary_store_f32": ([p, p, p, p, p, p, p, i64, i64, i64, i64, i64, c_int], c_int),
        "tgictl_rotary_store_bf16": ([p, p, p, p, p, p, p, i64, i64, i64, i64, i64, c_int], c_int),
        "tgictl_greedy_f32": ([p, i64, i64, p, p, c_int], i64),
        "tgictl_greedy_bf16": ([p, i64, i64, p, p, c_int], i64),
        "tgictl_topk_values_f32": ([p, i64, i64, i64, p, c_int], i64),
        "tgictl_decode_layers_scratch": ([i64] * 6, i64),
        "tgictl_decode_layers_bf16": ([i64, p, p, p, p, p, p, c_int, p, p, p, p, p, i64, i64, i64, i64, i64, i64, i64,
                                       i64, f32, f32, p, f32, p, p, c_int, c_int], c_int),
        "tgictl_amx_linear_available": ([], c_int),
        "tgictl_amx_linear_bf16": ([p, p, p, p, i64, i64, i64, c_int], c_int),
        "tgictl_prefill_attention_bf16": (prefill, c_int),
        "tgictl_prefill_attention_amx": (prefill, c_int),
        "tgictl_fma_linear_available": ([], c_int),
        "tgictl_fma_linear_bf16": ([p, p, p, p, i64, i64, i64, c_int], c_int),
        "tgictl_dpbf16_linear_available": ([], c_int),
        "tgictl_dpbf16_linear_bf16": ([p, p, p, p, i64, i64, i64, c_int], c_int),
        "tgictl_rotary_store_q8_f32": ([p, p, p, p, p, p, p, p, p, i64, i64, i64, i64, i64, c_int], c_int),
        "tgictl_rotary_store_q8_bf16": ([p, p, p, p, p, p, p, p, p, i64, i64, i64, i64, i64, c_int], c_int),
        "tgictl_paged_decode_q8": ([p, c_int, p, p, p, p, p, p, i64, i64, i64, i64, i64, f32, f32, p, c_int, c_int],
                                   c_int),
        "tgictl_prefill_attention_q8": ([p, p, p, p, p, p, i64, i64, i64, i64, i64, f32, i64, p, c_int], c_int),
    }
    for name, (argtypes, restype) in kernels.items():
        fn = getattr(library, name)
        fn.argtypes = argtypes
        fn.restype = restype
        functions.append(fn)
    return NativeKernels(path, library, *functions)


@functools.cache
def load_native_kernels() -> NativeKernels | None:
    """The compiled kernels, built on first use; None (after one warning) when unavailable."""
    env = read_env()
    if not env.native_kernels:
        return None
    compiler = env.c_compiler or "cc"
    if shutil.which(compiler) is None:
        log.warning("no C compiler (%s) found: decode attention runs on the pure-torch path, which is "
                    "slower on CPU; install gcc or set CC to enable the native kernel", compiler)
        return None
    try:
        return _bind(_build(compiler, env.cache_dir / "kernels"))
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as err:
        log.warning("native CPU kernels unavailable (%s): decode attention runs on the pure-torch path", err)
        return None
