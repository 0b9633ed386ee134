#!/usr/bin/env python3
"""Time tgictl's MoE layer against transformers' Qwen3-MoE block on the same weights, and say where its time goes.

    python scripts/bench_moe.py [--hidden 512] [--intermediate 256] [--experts 128] [--top-k 8] [--rows 1 16]
                                [--dtype bfloat16] [--repeats 30] [--threads N] [--json FILE]

One sparse block of a Qwen3-MoE-shaped model (128 experts, top 8, renormalised; Qwen3-30B-A3B has hidden 2048 and
experts of 768) with random weights, built by transformers and loaded into tgictl's layer (runtime/shard/layers/moe/)
as the shard loads it. Each call gets other random rows (a new routing, so the weights of the experts it reads come
from memory, as in a decode step of a real model), the same rows for every implementation; each figure is the
median of --repeats calls, the implementations interleaved so machine noise hits them alike:

- transformers, its default experts implementation (`grouped_mm`: torch's grouped matmul) and `eager` (a loop over
  the experts hit);
- tgictl's grouped path (what the shard runs) and its per-expert reference loop.

The breakdown splits tgictl's grouped path into the router (logits, softmax, top-k), the grouping (the pairs sorted
by expert, the rows gathered), the experts' products (one gate|up, SiLU·mul and down per active expert) and the
combine (the weighted sum back to the tokens); "bytes" is what the active experts' weights take, and GB/s that over
the expert time.
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

from tgictl.kernels.linear_methods import DenseWeight  # noqa: E402
from tgictl.kernels.moe import ExpertGroups  # noqa: E402
from tgictl.runtime.shard.dist import DistContext  # noqa: E402
from tgictl.runtime.shard.layers.moe import Experts, SparseMoE, TopKRouter  # noqa: E402

PHASES = ("router", "grouping", "experts", "combine")


def build(hidden: int, intermediate: int, experts: int, top_k: int, dtype: torch.dtype) -> tuple[object, SparseMoE]:
    """(transformers' block, tgictl's layer) on the same random weights."""
    import transformers
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = transformers.Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=intermediate, num_experts=experts,
                                         num_experts_per_tok=top_k, norm_topk_prob=True)
    config._experts_implementation = "grouped_mm"  # transformers' default for a loaded model
    block = Qwen3MoeSparseMoeBlock(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    block = block.to(dtype).eval()
    gate_up, down = block.experts.gate_up_proj, block.experts.down_proj
    layer = Experts([DenseWeight(gate_up[e].detach().clone()) for e in range(experts)],
                    [DenseWeight(down[e].detach().clone()) for e in range(experts)])
    router = TopKRouter(block.gate.weight.detach().clone(), top_k, normalize=True, weights_in_float32=False)
    return block, SparseMoE(router, layer, DistContext.single())


def grouped_phases(moe: SparseMoE, x: torch.Tensor) -> dict[str, float]:
    """The grouped path's steps (Experts.forward, SparseMoE.forward) with a clock between them, in seconds."""
    times = {}
    start = time.perf_counter()
    ids, weights = moe.router(x)
    times["router"] = time.perf_counter() - start
    start = time.perf_counter()
    groups = ExpertGroups.build(ids, moe.experts.num_experts)
    rows = groups.gather(x)
    times["grouping"] = time.perf_counter() - start
    start = time.perf_counter()
    outputs = moe.experts.grouped_outputs(rows, groups.spans)
    times["experts"] = time.perf_counter() - start
    start = time.perf_counter()
    groups.combine(outputs, weights).to(x.dtype)
    times["combine"] = time.perf_counter() - start
    times["active"] = len(groups.spans)
    return times


def measure(block: object, moe: SparseMoE, rows: int, hidden: int, dtype: torch.dtype, repeats: int,
            expert_bytes: int) -> dict[str, object]:
    generator = torch.Generator().manual_seed(rows)
    inputs = [torch.randn(rows, hidden, generator=generator).to(dtype) for _ in range(repeats + 2)]
    config = block.experts.config  # type: ignore[attr-defined]

    def transformers_with(implementation: str) -> Callable[[torch.Tensor], object]:
        def run(x: torch.Tensor) -> object:
            config._experts_implementation = implementation
            return block(x[None])  # type: ignore[operator]
        return run

    runs: dict[str, Callable[[torch.Tensor], object]] = {
        "transformers grouped_mm": transformers_with("grouped_mm"),
        "transformers eager": transformers_with("eager"),
        "tgictl grouped": moe,
        "tgictl reference loop": lambda x: moe.experts.reference(x, *moe.router(x)),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    phases: dict[str, list[float]] = {name: [] for name in (*PHASES, "active")}
    with torch.inference_mode():
        for name, run in runs.items():  # warm-up: kernels built, code paths taken once
            run(inputs[-1])
        for x in inputs[:repeats]:
            for name, run in runs.items():
                start = time.perf_counter()
                run(x)
                times[name].append(time.perf_counter() - start)
            for key, value in grouped_phases(moe, x).items():
                phases[key].append(value)
    medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    breakdown = {name: statistics.median(phases[name]) * 1e3 for name in PHASES}
    active = statistics.median(phases["active"])
    ours = medians["tgictl grouped"]
    return {
        "rows": rows,
        "ms": medians,
        "speedup_vs_transformers": {name: medians[name] / ours for name in medians if name.startswith("transformers")},
        "breakdown_ms": breakdown,
        "active_experts": active,
        "expert_bytes_read": int(active * expert_bytes),
        "expert_gb_per_s": active * expert_bytes / (breakdown["experts"] * 1e-3) / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=256, help="each expert's width")
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    block, moe = build(args.hidden, args.intermediate, args.experts, args.top_k, dtype)
    expert_bytes = 3 * args.hidden * args.intermediate * torch.empty((), dtype=dtype).element_size()
    print(f"Qwen3-MoE block: hidden {args.hidden}, {args.experts} experts of {args.intermediate}, top {args.top_k}, "
          f"{args.dtype}, {torch.get_num_threads()} threads, {args.repeats} calls each (median ms)")
    results = []
    for rows in args.rows:
        result = measure(block, moe, rows, args.hidden, dtype, args.repeats, expert_bytes)
        results.append(result)
        ms, parts = result["ms"], result["breakdown_ms"]
        print(f"\n{rows} rows: {result['active_experts']:.0f} active experts, "
              f"{result['expert_bytes_read'] / 2**20:.1f} MiB of their weights")
        for name, value in ms.items():  # type: ignore[union-attr]
            ratio = value / ms["tgictl grouped"]  # type: ignore[index]
            print(f"  {name:26s} {value:9.3f} ms  {ratio:6.2f}x tgictl grouped")
        total = sum(parts.values())  # type: ignore[union-attr]
        shares = [f"{name} {value:.3f} ms ({100 * value / total:.0f}%)"
                  for name, value in parts.items()]  # type: ignore[union-attr]
        print("  tgictl grouped, where the time goes: " + ", ".join(shares))
        print(f"  expert products read their weights at {result['expert_gb_per_s']:.1f} GB/s")
    if args.json is not None:
        args.json.write_text(json.dumps({"shape": vars(args) | {"json": None}, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
