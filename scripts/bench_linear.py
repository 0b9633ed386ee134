#!/usr/bin/env python3
"""Time torch's linear against the compiled small-row kernel on SmolLM2-135M's projection shapes.

    python scripts/bench_linear.py [--rows 1 2 4 8] [--dtypes bfloat16 float32] [--threads 2]
    python scripts/bench_linear.py --packed-sweep [--max-rows 64] [--write-table]
    python scripts/bench_linear.py --many-rows [--rows 8 16 32 64]

Each cell is the best of `--repeats` calls in milliseconds; the ratio column is torch / native.
tgictl/kernels/linear.py's SMALL_LINEAR_MAX_ROWS is the largest row count where native wins.

--packed-sweep times one pass over every bf16 linear of the model (30 layers' weights and the LM head,
prepacked for oneDNN as the shard holds them, so they stream from memory as in a decode step) at each row
count above SMALL_LINEAR_MAX_ROWS, and names the row counts that run faster zero-padded to more rows;
--write-table stores them for this CPU kind in kernel_choices.json ("row_padding"), which
DenseWeight reads (kernels/linear_methods/dispatch.py padded_rows).

--many-rows times one pass over the 30 layers' 120 bf16 projections (distinct weights, streamed from memory as
in a decode step) at each of --rows: oneDNN on prepacked copies, torch's F.linear on the plain weights, and
kernels/linear.py's linear() (the AMX or VDPBF16PS kernel where it has one for that row count), passes
interleaved, medians of --repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tgictl.kernels.linear import SMALL_LINEAR_MAX_ROWS, linear  # noqa: E402
from tgictl.kernels.linear_methods.dispatch import TABLE_PATH, cpu_kind  # noqa: E402
from tgictl.kernels.native import load_native_kernels  # noqa: E402
from tgictl.kernels.prepacked import packed_linear, prepack  # noqa: E402

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
    parser.add_argument("--packed-sweep", action="store_true")
    parser.add_argument("--many-rows", action="store_true")
    parser.add_argument("--max-rows", type=int, default=64)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--write-table", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.packed_sweep:
        packed_sweep(args)
        return
    if args.many_rows:
        many_rows(args)
        return
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


def many_rows(args: argparse.Namespace) -> None:
    plain = [torch.randn(n, k).bfloat16() for _ in range(args.layers) for _, n, k in SHAPES[:-1]]
    packed = [prepack(w) for w in plain]
    if any(p is None for p in packed):
        raise SystemExit("oneDNN cannot prepack bf16 weights here: nothing to compare against")
    print(f"cpu kind {cpu_kind()}; threads {torch.get_num_threads()}; ms per pass over {len(plain)} bf16 "
          "projections, median")
    for m in args.rows:
        inputs = {k: torch.randn(m, k).bfloat16() for k in {w.shape[1] for w in plain}}
        ways: dict[str, Callable[[], object]] = {
            "oneDNN prepacked": lambda: [packed_linear(inputs[w.shape[1]], p, None) for w, p in zip(plain, packed)],
            "F.linear": lambda: [F.linear(inputs[w.shape[1]], w) for w in plain],
            "linear()": lambda: [linear(inputs[w.shape[1]], w) for w in plain],
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeats):  # interleaved: a slow moment hits every way alike
            for name, fn in ways.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        print(f"rows {m}: " + ", ".join(f"{name} {statistics.median(t) * 1e3:.1f}" for name, t in times.items()))


# Pad only where the padded row count is at least this much faster: the sweep's noise stays unpadded.
MIN_PADDING_GAIN = 0.9
CONFIRM_ROUNDS = 7


def packed_sweep(args: argparse.Namespace) -> None:
    # (packed weight, in features) of every layer's projections, in model order
    weights = [(prepack(torch.randn(n, k).bfloat16()), k) for _ in range(args.layers) for _, n, k in SHAPES[:-1]]
    head = prepack(torch.randn(SHAPES[-1][1], SHAPES[-1][2]).bfloat16())
    if head is None or any(w is None for w, _ in weights):
        raise SystemExit("oneDNN cannot prepack bf16 weights here: nothing to sweep")
    first = SMALL_LINEAR_MAX_ROWS[torch.bfloat16] + 1
    rows_range = range(first, args.max_rows + 1)
    inputs = {m: {k: torch.randn(m, k).bfloat16() for k in {k for _, k in weights}} for m in rows_range}

    def one_pass(m: int) -> float:
        start = time.perf_counter()
        for w, k in weights:
            packed_linear(inputs[m][k], w, None)
        packed_linear(inputs[m][SHAPES[-1][2]], head, None)
        return time.perf_counter() - start

    times = {m: float("inf") for m in rows_range}
    for _ in range(max(1, args.repeats // 7)):  # sweeps interleaved: a slow moment hits every row count alike
        for m in rows_range:
            times[m] = min(times[m], one_pass(m))
    padding: dict[str, int] = {}
    for m in rows_range:
        best = min((p for p in rows_range if p >= m), key=lambda p: times[p])
        if times[best] >= MIN_PADDING_GAIN * times[m]:
            continue
        # a candidate from the sweep's minima, checked head to head (alternating, medians): noise is not kept
        pairs = [(one_pass(m), one_pass(best)) for _ in range(CONFIRM_ROUNDS)]
        if statistics.median(b for _, b in pairs) < MIN_PADDING_GAIN * statistics.median(a for a, _ in pairs):
            padding[str(m)] = best
    print(f"cpu kind {cpu_kind()}; threads {torch.get_num_threads()}; ms per pass over {len(weights) + 1} prepacked "
          "bf16 linears:")
    print(" ".join(f"{m}:{times[m] * 1e3:.1f}" for m in rows_range))
    print("padding (rows -> padded rows): " + (", ".join(f"{m}->{p}" for m, p in padding.items()) or "none"))
    if args.write_table:
        table = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
        machine = table.setdefault("machines", {}).setdefault(cpu_kind(), {"choices": {}})
        machine.setdefault("row_padding", {})["bfloat16"] = padding
        TABLE_PATH.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {len(padding)} row counts for {cpu_kind()} to {TABLE_PATH}")


if __name__ == "__main__":
    main()
