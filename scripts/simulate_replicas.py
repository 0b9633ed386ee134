"""Scale by simulation: N replicas behind the real SGLang Model Gateway, under a multi-tenant workload, one
run per gateway policy (docs/replicas.md, "Simulation"; the report: docs/replicas-simulation/).

Each replica is a real router (HTTP, validation, queue, batcher, radix prefix cache) over a fake shard
whose steps last what the real engine's would (tgictl/testing/timed_fake_shard.py, fitted to `tgictl bench
--shard` measurements), all in this one process; SMG runs as its own process in front. The workload:
tenants, each with its own system prompt, asking about shared documents chosen by a Zipf law, a unique
question each; requests stream, so the client measures the time to the first token.

    python scripts/simulate_replicas.py --replicas 16 --policies cache_aware round_robin prefix_hash \
        --out docs/replicas-simulation
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from tgictl.config import RouterConfig
from tgictl.runtime.bench.svg_charts import Series, line_chart
from tgictl.runtime.launcher.plan import free_port
from tgictl.runtime.router.http.app import create_app
from tgictl.runtime.router.service import RouterService
from tgictl.testing.fake_shard import FakeServiceClient
from tgictl.testing.timed_fake_shard import StepCost, TimedFakeClient
from tgictl.testing.tiny_models import write_tokenizer

WORDS = [f"{a}{b}{c}" for a in "bdgklmnprstvz" for b in "aeiou" for c in ("", "n", "r", "s")]


@dataclass(frozen=True)
class Workload:
    tenants: int
    documents: int
    zipf: float
    requests: int
    system_words: int
    document_words: int
    seed: int

    def prompts(self) -> list[str]:
        rng = random.Random(self.seed)
        systems = [f"System {t}: " + " ".join(rng.choice(WORDS) for _ in range(self.system_words))
                   for t in range(self.tenants)]
        docs = [f"Document {d}: " + " ".join(rng.choice(WORDS) for _ in range(self.document_words))
                for d in range(self.documents)]
        weights = [1.0 / (rank + 1) ** self.zipf for rank in range(self.documents)]
        tenant_weights = [1.0 / (rank + 1) ** self.zipf for rank in range(self.tenants)]
        out = []
        for i in range(self.requests):
            tenant = rng.choices(range(self.tenants), tenant_weights)[0]
            doc = rng.choices(range(self.documents), weights)[0]
            out.append(f"{systems[tenant]}\n{docs[doc]}\nQuestion {i}: {rng.choice(WORDS)} {rng.choice(WORDS)}?")
        return out


async def start_replicas(count: int, tokenizer: Path, cost: StepCost) -> tuple[list[RouterService], list[str], list[uvicorn.Server]]:
    services, urls, servers = [], [], []
    for _ in range(count):
        port = free_port()
        config = RouterConfig(master_shard_uds_path="/unused-0", tokenizer_name=str(tokenizer), port=port,
                              max_total_tokens=4096, max_input_tokens=4000, max_batch_prefill_tokens=4096,
                              max_concurrent_requests=512)
        client: FakeServiceClient = TimedFakeClient(cost=cost, supported_tokens=64 * 1024)
        service = await RouterService.start(config, tokenizer, client, "sim")
        server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_config=None,
                                               lifespan="off", access_log=False))
        asyncio.create_task(server.serve())
        services.append(service)
        urls.append(f"http://127.0.0.1:{port}")
        servers.append(server)
    while not all(s.started for s in servers):
        await asyncio.sleep(0.05)
    return services, urls, servers


async def one_request(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT s, end-to-end s, tokens) of one streamed completion through the gateway."""
    start = time.perf_counter()
    first, tokens = None, 0
    body = {"model": "sim", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                if first is None:
                    first = time.perf_counter() - start
                tokens += 1
    return first if first is not None else float("nan"), time.perf_counter() - start, tokens


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_policy(policy: str, args: argparse.Namespace, tokenizer: Path, cost: StepCost,
                     prompts: list[str], log_dir: Path) -> dict[str, object]:
    services, urls, servers = await start_replicas(args.replicas, tokenizer, cost)
    port = free_port()
    log = (log_dir / f"smg-{policy}.log").open("wb")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
         "--policy", policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
         "--disable-tokenizer-autoload", "--log-json", "--log-level", "warn", "--load-monitor-interval", "2",
         "--max-concurrent-requests", "0"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=600) as client:
            deadline = time.monotonic() + 120
            while True:
                try:
                    workers = (await client.get(f"{url}/workers")).json().get("workers", [])
                    if sum(w.get("status") == "ready" for w in workers) == args.replicas:
                        break
                except (httpx.TransportError, ValueError):
                    pass
                if time.monotonic() > deadline or gateway.poll() is not None:
                    raise RuntimeError(f"the gateway did not register {args.replicas} workers; see {log.name}")
                await asyncio.sleep(0.3)
            queue = list(enumerate(prompts))
            results: list[tuple[float, float, int] | None] = [None] * len(prompts)
            failures: list[str] = []

            async def client_loop() -> None:
                while queue:
                    index, prompt = queue.pop(0)
                    try:
                        results[index] = await one_request(client, url, prompt, args.max_tokens)
                    except (RuntimeError, httpx.HTTPError) as err:
                        failures.append(str(err))

            start = time.perf_counter()
            await asyncio.gather(*(client_loop() for _ in range(args.concurrency)))
            wall = time.perf_counter() - start
    finally:
        gateway.terminate()
        gateway.wait(60)
        log.close()
        for server in servers:
            server.should_exit = True
        for service in services:
            await service.close()
    done = [r for r in results if r is not None]
    hits = sum(s.metrics.prefix_cache_hit_tokens._value.get() for s in services)  # noqa: SLF001
    prompt_tokens = sum(s.metrics.prompt_tokens._value.get() for s in services)  # noqa: SLF001
    per_replica = [int(s.metrics.prompt_tokens._value.get()) for s in services]  # noqa: SLF001
    ttfts = [r[0] for r in done]
    return {
        "policy": policy, "requests": len(done), "failed": len(failures), "failures": failures[:3],
        "prefix_hit_rate": hits / prompt_tokens if prompt_tokens else 0.0,
        "ttft_p50_s": percentile(ttfts, 0.5), "ttft_p99_s": percentile(ttfts, 0.99),
        "e2e_p50_s": percentile([r[1] for r in done], 0.5),
        "requests_per_s": len(done) / wall, "output_tokens_per_s": sum(r[2] for r in done) / wall,
        "wall_s": wall, "prompt_tokens_per_replica": per_replica,
        "busy_s_per_replica": [round(s._client.busy_s, 1) for s in services],  # noqa: SLF001
        "mean_prompt_tokens": prompt_tokens / max(len(done), 1),
        "ttft_mean_s": statistics.fmean(ttfts),
    }


def report(results: list[dict[str, object]], setup: dict[str, object], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"setup": setup, "results": results}, indent=1))
    xs = list(range(len(results)))
    names = ", ".join(f"{i}: {r['policy']}" for i, r in enumerate(results))
    charts = {
        "prefix_hit_rate.svg": line_chart("Prefix-cache hit rate (share of prompt tokens)", f"policy ({names})",
                                          "hit rate", xs, [Series("hit rate", tuple(float(r["prefix_hit_rate"]) for r in results))]),  # type: ignore[arg-type]
        "ttft.svg": line_chart("Time to first token", f"policy ({names})", "seconds", xs,
                               [Series("p50", tuple(float(r["ttft_p50_s"]) for r in results)),  # type: ignore[arg-type]
                                Series("p99", tuple(float(r["ttft_p99_s"]) for r in results))]),  # type: ignore[arg-type]
        "throughput.svg": line_chart("Throughput", f"policy ({names})", "requests/s", xs,
                                     [Series("requests/s", tuple(float(r["requests_per_s"]) for r in results))]),  # type: ignore[arg-type]
    }
    for name, svg in charts.items():
        (out / name).write_text(svg)


async def main_async(args: argparse.Namespace) -> None:
    cost = StepCost.from_file(args.cost).scaled(args.time_scale)
    workload = Workload(args.tenants, args.documents, args.zipf, args.requests, args.system_words,
                        args.document_words, args.seed)
    prompts = workload.prompts()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = Path(tmp) / "tokenizer"
        tokenizer.mkdir()
        write_tokenizer(tokenizer)
        results = []
        for policy in args.policies:
            result = await run_policy(policy, args, tokenizer, cost, prompts, args.log_dir)
            print(json.dumps({k: v for k, v in result.items() if k not in ("failures",)}), flush=True)
            results.append(result)
    setup = {"replicas": args.replicas, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
             "workload": vars(workload), "step_cost": vars(cost), "time_scale": args.time_scale,
             "cost_source": json.loads(args.cost.read_text())["source"], "command": " ".join(sys.argv)}
    report(results, setup, args.out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--policies", nargs="+", default=["cache_aware", "round_robin", "prefix_hash"])
    parser.add_argument("--requests", type=int, default=640)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--tenants", type=int, default=24)
    parser.add_argument("--documents", type=int, default=48)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--system-words", type=int, default=60)
    parser.add_argument("--document-words", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cost", type=Path, default=Path(__file__).resolve().parents[1] / "docs" /
                        "replicas-simulation" / "measured_steps.json")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply every step's cost (< 1: faster)")
    parser.add_argument("--out", type=Path, default=Path("docs/replicas-simulation"))
    parser.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
