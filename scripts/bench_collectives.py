#!/usr/bin/env python3
"""The tensor-parallel collectives of one decode step, timed between two processes on this host: the
shared-memory path the shards use on one CPU host against gloo's TCP path.

A SmolLM2-135M decode step at batch B over 2 ranks makes 1 + 2 x 30 all-reduces of [B, 576] (the
embedding, then attention and MLP outputs of every layer) and one all-gather of the LM head's
[B, 24576] float32 logits. Each rank runs one thread, as the launcher gives two shards on two cores.

    python scripts/bench_collectives.py --batch 1 32 --dtype bfloat16 --steps 50
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tgictl.runtime.launcher.plan import free_port  # noqa: E402
from tgictl.runtime.shard.dist import all_gather, all_reduce, destroy_distributed, init_distributed  # noqa: E402

LAYERS, HIDDEN, VOCAB_PER_RANK = 30, 576, 24576


def _worker(rank: int, port: int, shared_memory: bool, batches: list[int], dtype: str, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist = init_distributed(rank, 2, "127.0.0.1", port, torch.device("cpu"), shared_memory=shared_memory)
    try:
        results = {}
        for batch in batches:
            hidden = torch.randn(batch, HIDDEN).to(getattr(torch, dtype))
            logits = torch.randn(batch, VOCAB_PER_RANK)
            times = []
            for step in range(steps + 5):
                start = time.perf_counter()
                for _ in range(1 + 2 * LAYERS):
                    all_reduce(hidden.clone(), dist)
                all_gather(logits, dist, dim=-1)
                if step >= 5:  # the first calls pay for allocation and connection set-up
                    times.append(time.perf_counter() - start)
            results[batch] = statistics.median(times)
        if rank == 0:
            Path(out).write_text(json.dumps(results))
    finally:
        destroy_distributed(dist)


def measure(shared_memory: bool, batches: list[int], dtype: str, steps: int) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        mp.spawn(_worker, args=(free_port(), shared_memory, batches, dtype, steps, out.name), nprocs=2)
        return json.loads(Path(out.name).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    shm = measure(True, args.batch, args.dtype, args.steps)
    gloo = measure(False, args.batch, args.dtype, args.steps)
    for batch in args.batch:
        key = str(batch)
        print(json.dumps({
            "batch": batch, "dtype": args.dtype, "calls_per_step": 2 + 2 * LAYERS,
            "shared_memory_ms_per_step": round(shm[key] * 1e3, 3), "gloo_ms_per_step": round(gloo[key] * 1e3, 3),
            "speedup": round(gloo[key] / shm[key], 1),
        }))


if __name__ == "__main__":
    main()
