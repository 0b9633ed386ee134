#!/usr/bin/env python3
"""The router's own cost per streamed token: the path from the batching task to the SSE bytes.

A real RouterService and its HTTP app (uvicorn) run in a child process against FakeServiceClient, which
fabricates tokens instantly, so the child does nothing but the router's work: scheduling, detokenizing,
stop strings, the stream to the HTTP layer, SSE framing. This process opens N concurrent
/generate_stream requests and reads the child's CPU time (/proc) around the load, so the client's own
work is not counted. Prints router CPU microseconds per token and tokens/s, median of the repeats.

    python scripts/bench_stream_path.py --streams 64 --tokens 256 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def serve(port: int, tokenizer_dir: Path) -> None:
    """The child: a RouterService on a fake shard client, served by uvicorn until killed."""
    import uvicorn

    from tgictl.config import RouterConfig
    from tgictl.runtime.router.http.app import create_app
    from tgictl.runtime.router.service import RouterService
    from tgictl.testing.fake_shard import FakeServiceClient

    async def main() -> None:
        config = RouterConfig(
            master_shard_uds_path="unused", tokenizer_name=str(tokenizer_dir), port=port,
            max_concurrent_requests=1024, max_total_tokens=4096, max_batch_prefill_tokens=4096,
        )
        client = FakeServiceClient(supported_tokens=1 << 20)
        service = await RouterService.start(config, tokenizer_dir, client, "fake")
        server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port,
                                               log_config=None, lifespan="off", access_log=False))
        await server.serve()

    asyncio.run(main())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_stream(client: httpx.AsyncClient, url: str, tokens: int, prompt: str) -> int:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": tokens, "ignore_eos": True}}
    seen = 0
    async with client.stream("POST", f"{url}/generate_stream", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                seen += 1
    return seen


async def load(url: str, streams: int, tokens: int, run: int) -> int:
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        counts = await asyncio.gather(*(one_stream(client, url, tokens, f"run {run} stream {i}") for i in range(streams)))
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # child mode: the port
    parser.add_argument("--tokenizer", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.tokenizer)
        return

    from tgictl.runtime.launcher.plan import free_port
    from tgictl.testing.tiny_models import write_tokenizer

    with tempfile.TemporaryDirectory(prefix="tgictl-stream-bench-") as work:
        tokenizer_dir = Path(work)
        write_tokenizer(tokenizer_dir)
        port = free_port()
        child = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--tokenizer", str(tokenizer_dir)])
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if child.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the router did not start")
                time.sleep(0.2)
            asyncio.run(load(url, args.streams, 16, -1))  # warm up connections and code paths
            results = []
            for run in range(args.repeats):
                cpu0, wall0 = cpu_seconds(child.pid), time.perf_counter()
                events = asyncio.run(load(url, args.streams, args.tokens, run))
                cpu, wall = cpu_seconds(child.pid) - cpu0, time.perf_counter() - wall0
                results.append({"events": events, "router_cpu_us_per_token": cpu / events * 1e6,
                                "tokens_per_s": events / wall})
                print(json.dumps(results[-1]), flush=True)
            print(json.dumps({
                "streams": args.streams, "tokens": args.tokens,
                "median_router_cpu_us_per_token": statistics.median(r["router_cpu_us_per_token"] for r in results),
                "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in results),
            }))
        finally:
            child.terminate()
            child.wait(timeout=30)


if __name__ == "__main__":
    main()
