"""How close the shard's decode step comes to this machine's limit.

    python scripts/engine_bound.py [--batch 1,16] [--context 256] [--dtype bfloat16] [--threads 2]
        [--kv-cache-dtype auto|int8] [--model-dir DIR | FILE.gguf] [--markdown-out FILE]

Measures the DRAM read bandwidth (a sum over a tensor far larger than the caches) and the GEMM rate
(square matmuls at 2048, the best the cores reach: torch's in the dtype, or in float32 where that is
faster, since a CPU without bf16 math multiplies bf16 at most at its float32 FMA rate (AVX2: torch's bf16
matmul is a generic loop there); and the model's own projections at `--batch` rows, through the shard's
linear), computes the step's bound from them (tgictl/runtime/profile/step_bound.py: the bytes
it must stream and the FLOPs it must do; for a GGUF file, its tensors' bytes), then times the real served step (ModelRunner.generate_token
on a decode batch, scripts/perf_decode.py's setup) and prints the ratio bound / measured, for each --batch size
(one markdown row each: weights and KV bytes per step, the bound, the measured step).
Not a test: figures depend on the machine and its load (printed with them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

from perf_decode import DEFAULT_MODEL, decode_batch  # noqa: E402

from tgictl.env import apply_shard_library_defaults  # noqa: E402
from tgictl.kv_cache_dtype import KV_CACHE_DTYPES  # noqa: E402
from tgictl.kernels.linear import linear  # noqa: E402
from tgictl.runtime.gguf_reader import read_gguf  # noqa: E402
from tgictl.runtime.model_files.gguf_model import is_gguf_path, served_gguf_file  # noqa: E402
from tgictl.runtime.model_files.resolve import resolve_model  # noqa: E402
from tgictl.runtime.profile.model_shape import ModelShape, model_shape  # noqa: E402
from tgictl.runtime.profile.hardware import measure_matmul_flops  # noqa: E402
from tgictl.runtime.profile.step_bound import decode_step_bound  # noqa: E402


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second of a float32 sum over `gib` GiB (median of `repeats`): memory-bound on any CPU."""
    data = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    data.sum()  # touches every page once
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.numel() * 4 / statistics.median(times)


def model_gemm_rate(shape: ModelShape, rows: int, dtype: torch.dtype, repeats: int = 5) -> float:
    """FLOP/s of the step's weight matmuls at `rows` rows: one layer's projections (timed once,
    counted num_layers times) and the LM head, with the shard's linear (kernels/linear.py) on the plain
    weights."""
    h, d = shape.hidden_size, shape.head_dim
    layer = [((shape.num_heads + 2 * shape.num_kv_heads) * d, h), (h, shape.num_heads * d),
             (2 * shape.intermediate_size, h), (h, shape.intermediate_size)]
    head = (shape.vocab_size, h)

    def timed(shapes: list[tuple[int, int]]) -> tuple[int, float]:
        weights = [torch.randn(out, k).to(dtype) for out, k in shapes]
        inputs = [torch.randn(rows, k).to(dtype) for _, k in shapes]
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            for x, w in zip(inputs, weights):
                linear(x, w)
            times.append(time.perf_counter() - start)
        return sum(2 * rows * w.numel() for w in weights), statistics.median(times[1:])

    layer_flops, layer_s = timed(layer)
    head_flops, head_s = timed([head])
    return (shape.num_layers * layer_flops + head_flops) / (shape.num_layers * layer_s + head_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", default="1,16", help="decode rows, comma-separated")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=9, help="timed decode steps (median)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES))
    parser.add_argument("--markdown-out", type=Path, default=None)
    args = parser.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    if is_gguf_path(args.model_dir):  # served natively from its metadata directory, as `tgictl launch` does
        args.model_dir = resolve_model(str(args.model_dir), allow_download=False)
    gguf = served_gguf_file(args.model_dir)
    gguf_bytes = None if gguf is None else sum(t.nbytes for t in read_gguf(gguf).tensors.values())
    apply_shard_library_defaults()  # the shard's huge pages and oneDNN cache, before the first big allocation
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    shape = model_shape(json.loads((args.model_dir / "config.json").read_text()))
    load_before = os.getloadavg()[0]

    bandwidth = read_bandwidth()
    in_dtype = measure_matmul_flops(args.dtype, size=2048, seconds=0.3, repeats=3).flops_per_s
    in_float32 = in_dtype if dtype == torch.float32 else \
        measure_matmul_flops("float32", size=2048, seconds=0.3, repeats=3).flops_per_s
    peak = max(in_dtype, in_float32)
    rows = [f"| rows | cached tokens | weights MB | KV MB ({args.kv_cache_dtype}) | bound ms | limited by | "
            "measured step ms | bound / measured |", "|---|---|---|---|---|---|---|---|"]
    for batch in batches:
        at_batch = model_gemm_rate(shape, batch, dtype)
        bound = decode_step_bound(shape, batch=batch, context=args.context, dtype_bytes=dtype.itemsize,
                                  bandwidth_bytes_per_s=bandwidth, gemm_flops_per_s=peak,
                                  kv_cache_dtype=args.kv_cache_dtype, weight_bytes=gguf_bytes)
        at_shapes = decode_step_bound(shape, batch=batch, context=args.context, dtype_bytes=dtype.itemsize,
                                      bandwidth_bytes_per_s=bandwidth, gemm_flops_per_s=at_batch,
                                      kv_cache_dtype=args.kv_cache_dtype, weight_bytes=gguf_bytes)
        step = measured_step(args, dtype, batch)
        print(f"step of {batch} x {args.context} cached: streams {bound.weight_bytes / 1e6:.0f} MB weights + "
              f"{bound.kv_bytes / 1e6:.0f} MB KV -> {bound.memory_s * 1e3:.1f} ms; "
              f"{(bound.gemm_flops + bound.attention_flops) / 1e9:.2f} GFLOP -> {bound.compute_s * 1e3:.1f} ms at "
              f"the peak rate, {at_shapes.compute_s * 1e3:.1f} ms at the model-shape rate "
              f"({at_batch / 1e9:.0f} GFLOP/s with {batch} rows)")
        print(f"bound {bound.bound_s * 1e3:.1f} ms ({bound.limited_by}; {batch / bound.bound_s:.0f} tok/s); "
              f"measured step {step * 1e3:.1f} ms ({batch / step:.1f} tok/s): {bound.bound_s / step:.0%} of the "
              f"bound ({at_shapes.bound_s / step:.0%} of the bound at the model-shape GEMM rate)", flush=True)
        rows.append(f"| {batch} | {args.context} | {bound.weight_bytes / 1e6:.0f} | {bound.kv_bytes / 1e6:.0f} | "
                    f"{bound.bound_s * 1e3:.1f} | {bound.limited_by} | {step * 1e3:.1f} | {bound.bound_s / step:.0%} |")
    load = max(load_before, os.getloadavg()[0])
    machine = (f"{torch.get_num_threads()} threads, load {load:.2f}; DRAM read {bandwidth / 1e9:.1f} GB/s; "
               f"{args.dtype} GEMM {in_dtype / 1e9:.0f} GFLOP/s at 2048^3 (float32 {in_float32 / 1e9:.0f}; the peak "
               f"taken: {peak / 1e9:.0f})")
    source = "" if gguf is None else f" (GGUF {gguf.resolve().name}: its {gguf_bytes / 1e6:.0f} MB of tensors streamed)"
    table = f"{args.model_dir.name}{source}, {args.dtype}: {machine}\n\n" + "\n".join(rows) + "\n"
    print(table)
    if args.markdown_out is not None:
        args.markdown_out.write_text(table)


def measured_step(args: argparse.Namespace, dtype: torch.dtype, batch: int) -> float:
    """The median seconds of the served decode step (ModelRunner.generate_token) of `batch` rows."""
    _, runner, decode, prefill_s = decode_batch(args.model_dir, dtype, batch, args.context, args.steps + 4,
                                                kv_cache_dtype=args.kv_cache_dtype)
    print(f"prefill of {batch} prompt(s) of {args.context} tokens ({args.kv_cache_dtype} cache): {prefill_s:.1f} s, "
          f"{prefill_s / batch:.2f} s each", flush=True)
    times = []
    for _ in range(args.steps + 2):
        start = time.perf_counter()
        _, kept, _ = runner.generate_token(decode)
        times.append(time.perf_counter() - start)
        if kept is None:
            raise SystemExit("the batch finished early")
        decode = kept
    return statistics.median(times[2:])

if __name__ == "__main__":
    main()
