#!/usr/bin/env python3
"""Time torch's linear against the compiled small-row kernel on SmolLM2-135M's projection shapes.

    python scripts/bench_linear.py [--rows 1 2 4 8] [--dtypes bfloat16 float32] [--threads 2]

Each cell is the best of `--repeats` calls in milliseconds; the ratio column is torch / native.
tgictl/kernels/linear.py's SMALL_LINEAR_MAX_ROWS is the largest row count where native wins.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tgictl.kernels.native import load_native_kernels  # noqa: E402

# (name, out features, in features): fused qkv, o, fused gate/up, down, LM head
SHAPES = [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536), ("lm_head", 49152, 576)]


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    native = load_native_kernels()
    if native is None:
        raise SystemExit("the native kernels are unavailable here (see the warning above)")
    print(f"threads {torch.get_num_threads()}; ms per call, best of {args.repeats}")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for rows in args.rows:
            cells, total_torch, total_native = [], 0.0, 0.0
            for name, out_features, in_features in SHAPES:
                weight = torch.randn(out_features, in_features).to(dtype)
                x = torch.randn(rows, in_features).to(dtype)
                t = best_ms(lambda: F.linear(x, weight), args.repeats)
                n = best_ms(lambda: native.small_linear(x, weight, None), args.repeats)
                total_torch, total_native = total_torch + t, total_native + n
                cells.append(f"{name} {t:.3f}/{n:.3f}")
            print(f"{dtype_name} rows {rows}: " + ", ".join(cells)
                  + f"; sum torch {total_torch:.2f} native {total_native:.2f} ({total_torch / total_native:.2f}x)")


if __name__ == "__main__":
    main()
