"""/health while the server is saturated: its latency (p50, p99, max) and every non-200 answer.

The load, all at once (issue 42's): one prompt of the longest length the server accepts, N requests with
distinct JSON-schema grammars, and M plain streams; /health is asked every --interval seconds meanwhile, from
its own client. Either starts `tgictl launch` on --model-id (of this checkout, or of --checkout, so an older
commit runs the same load) or measures a running server (--url).

    python scripts/bench_health.py --model-id DIR            # DIR: SmolLM2 converted by `tgictl download`
    python scripts/bench_health.py --url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench_common import REPO_ROOT, free_port, managed_server, repo_env


def grammar(index: int) -> dict[str, Any]:
    """A distinct small schema per request: no two compile to the same grammar (no cache hit anywhere)."""
    return {"type": "object", "properties": {f"field_{index}_{k}": {"type": "integer", "minimum": 0,
                                                                        "maximum": 10 ** (k + 2)} for k in range(4)},
            "required": [f"field_{index}_0"], "additionalProperties": False}


async def _load(client: httpx.AsyncClient, max_input: int, grammars: int, streams: int,
                new_tokens: int) -> list[int]:
    long_prompt = client.post("/generate", json={"inputs": "hello " * max_input, "parameters": {
        "max_new_tokens": 1, "truncate": max_input}})
    constrained = [client.post("/generate", json={"inputs": f"Describe item {i} as JSON.", "parameters": {
        "max_new_tokens": new_tokens, "grammar": {"type": "json", "value": grammar(i)}}}) for i in range(grammars)]
    plain = [client.post("/generate_stream", json={"inputs": f"Stream number {i} says", "parameters": {
        "max_new_tokens": new_tokens, "ignore_eos": True}}) for i in range(streams)]
    answers = await asyncio.gather(long_prompt, *constrained, *plain, return_exceptions=True)
    return [a.status_code if isinstance(a, httpx.Response) else 0 for a in answers]


async def _probe(url: str, interval_s: float, stop: asyncio.Event) -> list[tuple[float, int]]:
    samples: list[tuple[float, int]] = []
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as probe:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                status = (await probe.get("/health")).status_code
            except httpx.HTTPError:
                status = 0
            samples.append((time.perf_counter() - start, status))
            await asyncio.sleep(interval_s)
    return samples


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    info = httpx.get(f"{url}/info", timeout=30).json()
    stop = asyncio.Event()
    probing = asyncio.ensure_future(_probe(url, args.interval, stop))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=1200.0, limits=limits) as client:
        start = time.perf_counter()
        statuses = await _load(client, info["max_input_tokens"], args.grammars, args.streams, args.new_tokens)
        seconds = time.perf_counter() - start
    stop.set()
    samples = await probing
    latencies = sorted(s for s, _ in samples)
    return {
        "load_s": round(seconds, 2),
        "load_statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))},
        "health_probes": len(samples),
        "health_non_200": [status for _, status in samples if status != 200],
        "health_p50_ms": round(1000 * statistics.median(latencies), 1),
        "health_p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
        "health_max_ms": round(1000 * latencies[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model-id", help="start `tgictl launch` on this model")
    where.add_argument("--url", help="measure a running server")
    parser.add_argument("--checkout", type=Path, default=None, help="launch the tgictl of this checkout instead")
    parser.add_argument("--grammars", type=int, default=24)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between /health probes")
    parser.add_argument("--max-total-tokens", type=int, default=2048)
    parser.add_argument("--launch-arg", action="append", default=[], help="one more `tgictl launch` argument")
    args = parser.parse_args()
    if args.url is not None:
        print(json.dumps(asyncio.run(measure(args.url, args)), indent=2))
        return
    port = free_port()
    env = repo_env()
    checkout = REPO_ROOT if args.checkout is None else args.checkout.resolve()
    env["PYTHONPATH"] = str(checkout)  # `python -m` imports from its working directory first: run it there too
    command = [sys.executable, "-m", "tgictl", "launch", "--model-id", args.model_id, "--port", str(port),
               "--max-total-tokens", str(args.max_total_tokens), "--max-concurrent-requests", "256", *args.launch_arg]
    url = f"http://127.0.0.1:{port}"
    with managed_server("tgictl", command, f"{url}/health", env=env, cwd=checkout):
        print(json.dumps(asyncio.run(measure(url, args)), indent=2))


if __name__ == "__main__":
    main()
