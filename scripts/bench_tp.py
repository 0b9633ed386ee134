#!/usr/bin/env python3
"""Tensor parallelism on this host: the same static decode batches through one shard (all cores) and
through N shards (cores / N threads each), alternating, with `tgictl bench --shard` (TGI's
text-generation-benchmark shape: no router in the way). Prints decode tokens/s per batch size for
each, their ratio (medians over the repeats), and which collectives the shards used.

    python scripts/bench_tp.py --model-id DIR --batch-size 1,32 --sequence-length 256 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tgictl.runtime.host import usable_cores  # noqa: E402
from tgictl.runtime.launcher.plan import free_port  # noqa: E402


def start_shards(model: str, shards: int, dtype: str, kv: str, work: Path, shm: bool) -> list[subprocess.Popen]:
    base = work / f"tp{shards}" / "s"
    port = free_port()
    threads = max(1, usable_cores() // shards)
    procs = []
    for rank in range(shards):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(shards), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
                   TGICTL_SHM_COLLECTIVES="1" if shm else "0")
        log = open(work / f"tp{shards}-rank{rank}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, "-m", "tgictl", "shard", "--model-id", model,
                                       "--uds-path", str(base), "--dtype", dtype, "--kv-cache-memory", kv],
                                      env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT))
    deadline = time.monotonic() + 300
    while not all(Path(f"{base}-{r}").exists() for r in range(shards)):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            stop(procs)
            raise SystemExit(f"shards did not start: see {work}")
        time.sleep(0.5)
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def bench(uds: Path, args: argparse.Namespace, threads: int) -> dict[int, float]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    result = subprocess.run(
        [sys.executable, "-m", "tgictl", "--json-output", "bench", "--shard", str(uds), "--batch-size", args.batch_size,
         "--sequence-length", str(args.sequence_length), "--decode-length", str(args.decode_length),
         "--runs", str(args.runs), "--warmups", "1"],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, check=True,
    )
    document = json.loads(result.stdout)
    return {b["batch_size"]: b["decode_throughput"]["p50"] for b in document["batches"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--kv-cache-memory", default="1GiB")
    parser.add_argument("--batch-size", default="1,32")
    parser.add_argument("--sequence-length", type=int, default=256)
    parser.add_argument("--decode-length", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gloo", action="store_true", help="the N-shard side uses gloo's collectives")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tgictl-bench-tp-"))
    results: dict[str, list[dict[int, float]]] = {"1": [], str(args.shards): []}
    try:
        for _ in range(args.repeats):
            for shards in (1, args.shards):
                procs = start_shards(args.model_id, shards, args.dtype, args.kv_cache_memory, work, not args.gloo)
                try:
                    uds = work / f"tp{shards}" / "s-0"
                    results[str(shards)].append(bench(uds, args, max(1, usable_cores() // shards)))
                finally:
                    stop(procs)
        logs = " ".join((work / f"tp{args.shards}-rank0.log").read_text().split())
        collectives = "shared memory" if "collectives over shared memory" in logs else "gloo"
        for batch in results["1"][0]:
            one = statistics.median(r[batch] for r in results["1"])
            many = statistics.median(r[batch] for r in results[str(args.shards)])
            print(json.dumps({"batch": batch, "dtype": args.dtype, "tp1_tokens_per_s": round(one, 1),
                              f"tp{args.shards}_tokens_per_s": round(many, 1), "ratio": round(many / one, 3),
                              "collectives": collectives, "repeats": args.repeats}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
