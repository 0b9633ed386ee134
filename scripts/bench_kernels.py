#!/usr/bin/env python3
"""Time reference vs fast paged attention (decode, and a few prefill shapes) and print a table.

    python scripts/bench_kernels.py                      # SmolLM2-135M shapes, CPU
    python scripts/bench_kernels.py --context 1024 --batches 1 16 --device cuda

Decode columns: `reference` (per-sequence float32 loop), `fast` (the dispatched path: one gather +
float32 SDPA for the whole batch), `matmul` (the same gather + batched matmul and masked float32
softmax, kept here to show why the fast path uses SDPA), `meta` (building the metadata once per
forward, shared by all layers). Times are the best of `--repeats` calls in milliseconds (one
layer): the minimum is the kernel's own cost, robust to other processes sharing a small CPU box.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Run from a checkout without installing: put the repository root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from tgictl.kernels import (  # noqa: E402
    AttentionMetadata,
    attention,
    attention_reference,
    build_attention_metadata,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def best_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(2):  # warm up allocator and kernels
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def matmul_decode(
    query: Tensor, key_cache: Tensor, value_cache: Tensor, meta: AttentionMetadata, scale: float
) -> Tensor:
    """The batched-matmul alternative to SDPA (same gather, same float32 softmax), for comparison."""
    plan = meta.decode
    if plan is None:  # the bench only calls this on decode batches
        raise ValueError("matmul_decode needs a batch with decode rows")
    n, heads, head_dim = query.shape
    kv_heads = key_cache.shape[2]
    t = plan.max_context_len
    # k, v: [n, T, kv_heads, head_dim]
    k = key_cache.view(-1, kv_heads, head_dim).index_select(0, plan.slots).float().view(n, t, kv_heads, -1)
    v = value_cache.view(-1, kv_heads, head_dim).index_select(0, plan.slots).float().view(n, t, kv_heads, -1)
    q = query.float().view(n, kv_heads, heads // kv_heads, head_dim)
    scores = torch.matmul(q, k.permute(0, 2, 3, 1)).mul_(scale).add_(plan.bias)  # [n, kv, group, T]
    out = torch.matmul(torch.softmax(scores, dim=-1), v.transpose(1, 2))
    return out.reshape(n, heads, head_dim).to(query.dtype)


def paged_batch(
    cache_lens: list[int],
    new_lens: list[int],
    args: argparse.Namespace,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[Tensor, Tensor, Tensor, list[list[int]]]:
    """Random caches with each sequence's blocks scattered (shuffled ids), plus the new-token queries."""
    bs = args.block_size
    per_seq = [-(-(c + n) // bs) for c, n in zip(cache_lens, new_lens)]
    num_blocks = sum(per_seq) + 1
    ids = (torch.randperm(num_blocks - 1) + 1).tolist()
    tables = []
    for count in per_seq:
        tables.append(ids[:count])
        ids = ids[count:]
    shape = (num_blocks, bs, args.kv_heads, args.head_dim)
    key_cache = torch.randn(shape, device=device).to(dtype)
    value_cache = torch.randn(shape, device=device).to(dtype)
    query = torch.randn(sum(new_lens), args.heads, args.head_dim, device=device).to(dtype)
    return query, key_cache, value_cache, tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=256, help="cached tokens per decode sequence")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, nargs="+", default=[128, 512], help="prefill lengths")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    scale = args.head_dim**-0.5

    print(
        f"decode: heads={args.heads} kv_heads={args.kv_heads} head_dim={args.head_dim} "
        f"block_size={args.block_size} cached={args.context} device={device} "
        f"threads={torch.get_num_threads()}"
    )
    header = ("dtype", "batch", "reference", "fast", "matmul", "meta", "speedup", "max|err|")
    print("{:<9} {:>5} {:>10} {:>8} {:>8} {:>7} {:>8} {:>9}".format(*header))
    for dtype_name in args.dtypes:
        dtype = DTYPES[dtype_name]
        for batch in args.batches:
            cache_lens, new_lens = [args.context] * batch, [1] * batch
            query, kc, vc, tables = paged_batch(cache_lens, new_lens, args, dtype, device)

            def build() -> AttentionMetadata:
                return build_attention_metadata(cache_lens, new_lens, tables, args.block_size, device)

            meta = build()
            ref_repeats = max(5, args.repeats // 3)  # the reference is the slow one
            ref_ms = best_ms(lambda: attention_reference(query, kc, vc, meta, scale), ref_repeats, device)
            fast_ms = best_ms(lambda: attention(query, kc, vc, meta, scale), args.repeats, device)
            mm_ms = best_ms(lambda: matmul_decode(query, kc, vc, meta, scale), args.repeats, device)
            meta_ms = best_ms(build, args.repeats, device)
            fast_out = attention(query, kc, vc, meta, scale).float()
            err = fast_out - attention_reference(query, kc, vc, meta, scale).float()
            print(
                f"{dtype_name:<9} {batch:>5} {ref_ms:>10.3f} {fast_ms:>8.3f} {mm_ms:>8.3f} {meta_ms:>7.3f} "
                f"{ref_ms / fast_ms:>7.1f}x {err.abs().max().item():>9.2e}"
            )

    print("\nprefill: one sequence, no cached prefix or half of it cached")
    print(f"{'dtype':<9} {'tokens':>6} {'cached':>6} {'reference':>10} {'fast':>8} {'speedup':>8}")
    for dtype_name in args.dtypes:
        dtype = DTYPES[dtype_name]
        for tokens in args.prompts:
            for cached in (0, tokens // 2):
                cache_lens, new_lens = [cached], [tokens - cached]
                query, kc, vc, tables = paged_batch(cache_lens, new_lens, args, dtype, device)
                meta = build_attention_metadata(cache_lens, new_lens, tables, args.block_size, device)
                repeats = max(3, args.repeats // 5)
                ref_ms = best_ms(lambda: attention_reference(query, kc, vc, meta, scale), repeats, device)
                fast_ms = best_ms(lambda: attention(query, kc, vc, meta, scale), repeats, device)
                speedup = ref_ms / fast_ms
                print(
                    f"{dtype_name:<9} {tokens:>6} {cached:>6} {ref_ms:>10.3f} {fast_ms:>8.3f} {speedup:>7.1f}x"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
