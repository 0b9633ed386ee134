"""KV memory spent as it is used (issue 46): this checkout against an older one (--checkout), the same loads
on the same model, one server at a time, in one run.

- concurrency: a KV budget of 4,096 tokens, 24 chat requests (greedy, max_tokens 900, stop "." : they end at
  their first sentence), all at once. Reports the most requests that ran in one step (tgi_batch_current_size,
  polled), that every one answered, and whether the answers equal the other server's.
- throughput: chat requests with max_tokens 1024 whose answers end after a lognormal number of tokens
  (median 200, sigma 0.7, at most 1024; the client closes its stream there, which ends the request on the
  server as an answer that stopped would), at a KV budget that admits 8 of them when each holds
  input + 1024 - 1 from admission, ALL SENT AT ONCE (--requests). Reports tokens received per second over
  the whole run and the time to first token (p50, p99). This burst measures its tail more than the
  scheduler: the run lasts at least as long as its longest request (the lognormal tail reaches 1024
  tokens), which decodes nearly alone at the end whatever the scheduler does, so the ratio between two
  servers is capped (kept for comparison with the figures measured that way).
- chat: the same requests as a steady stream, as a chat service sees them: --clients clients (32, well
  above the 8 the old server runs at once) each send their next request when the previous one answers,
  for --duration seconds; the streams still open then are closed. Throughput is the tokens received
  between --warmup and --duration, divided by that window (no start-up ramp, no drained tail: both
  servers are measured at their steady state, every client busy). Time to first token (p50, p99) of every
  request sent; one still waiting for its first token at the end counts with its wait so far (a lower
  bound, which can only flatter the slower server). Also: the mean and largest running batch (polled) and
  the preemptions the server counted.
- priority: a KV budget of 4,096 tokens, 12 requests of 900 tokens (850-token prompts, 50 new) at priority
  10, more than the cache holds at once, then one more at priority 0; this checkout runs with
  --scheduling-policy priority (an older one ignores the field). Reports its time to first token against
  the median of the 12, and beside it the time to first token of one such request alone on the idle
  server first (its own prefill: the floor), and the 12 times to first token (the steps it waited behind).

    python scripts/bench_kv_demand.py --model-id DIR --checkout OLD_CHECKOUT [--scenario NAME ...] [--json OUT]
        [--requests 40] [--clients 32 --duration 75 --warmup 15] [--this-only]

DIR: SmolLM2 as `tgictl download HuggingFaceTB/SmolLM2-135M-Instruct` converts it. Timings on a shared
machine are noisy: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

from bench_common import REPO_ROOT, free_port, managed_server, repo_env

QUESTIONS = [
    "What is the capital of France?", "Why is the sky blue?", "How do plants make food?", "What is a prime number?",
    "Who wrote Hamlet?", "What does a CPU do?", "How far is the Moon?", "What is photosynthesis?",
    "Why do we have seasons?", "What is an atom?", "How do vaccines work?", "What is the speed of light?",
    "What is gravity?", "How does a rainbow form?", "What is DNA?", "Why is the ocean salty?",
    "What is a black hole?", "How do bees make honey?", "What causes earthquakes?", "What is inflation?",
    "How does the heart pump blood?", "What is a volcano?", "Why do leaves change color?", "What is democracy?",
]


def chat(question: str) -> str:
    """SmolLM2's chat template (ChatML with its default system prompt), so TGI's route streams token ids."""
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


@dataclass
class Progress:
    """A request as it streams: when it was sent and when each token came (seconds from the load's start)."""
    sent_s: float
    token_s: list[float]


@dataclass(frozen=True)
class Answer:
    status: int
    ttft_s: float | None  # None when no token came
    tokens: int
    text: str
    end_s: float  # from the load's start


async def stream(client: httpx.AsyncClient, start: float, inputs: str, parameters: dict[str, Any],
                 stop_after: int | None = None, progress: Progress | None = None) -> Answer:
    """One /generate_stream request; with `stop_after` the client closes the stream after that many tokens;
    `progress` (if given) records each token's arrival as it comes."""
    sent = time.perf_counter()
    ttft, tokens, text = None, 0, []
    async with client.stream("POST", "/generate_stream", json={"inputs": inputs, "parameters": parameters}) as response:
        if response.status_code != 200:
            await response.aread()
            return Answer(response.status_code, None, 0, response.text, time.perf_counter() - start)
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if "token" not in event:
                continue
            tokens += 1
            if progress is not None:
                progress.token_s.append(time.perf_counter() - start)
            text.append(event["token"]["text"])
            if ttft is None:
                ttft = time.perf_counter() - sent
            if stop_after is not None and tokens >= stop_after:
                break
    return Answer(200, ttft, tokens, "".join(text), time.perf_counter() - start)


async def poll_batch_size(url: str, stop: asyncio.Event) -> list[int]:
    """The running batch's size as /metrics reports it (tgi_batch_current_size), every 20 ms while the load runs."""
    sizes = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while not stop.is_set():
            for line in (await client.get("/metrics")).text.splitlines():
                if line.startswith("tgi_batch_current_size "):
                    sizes.append(int(float(line.split()[1])))
            await asyncio.sleep(0.02)
    return sizes or [0]


async def preemptions(url: str) -> int | None:
    """tgictl_request_preemptions_total (None: a server without preemption)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for line in (await client.get("/metrics")).text.splitlines():
            if line.startswith("tgictl_request_preemptions_total "):
                return int(float(line.split()[1]))
    return None


def client(url: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(3600.0, connect=10.0), limits=limits)


async def concurrency(url: str, args: argparse.Namespace) -> dict[str, Any]:
    stop = asyncio.Event()
    peak = asyncio.ensure_future(poll_batch_size(url, stop))
    async with client(url) as http:
        start = time.perf_counter()
        answers = await asyncio.gather(*(stream(http, start, chat(q), {
            "max_new_tokens": 900, "stop": ["."], "do_sample": False}) for q in QUESTIONS))
        seconds = time.perf_counter() - start
    stop.set()
    return {"peak_running": max(await peak), "answered": sum(a.status == 200 and a.tokens > 0 for a in answers),
            "requests": len(answers), "seconds": round(seconds, 2), "texts": [a.text for a in answers],
            "tokens": sum(a.tokens for a in answers)}


def lognormal_lengths(count: int, median: int, sigma: float, limit: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [min(limit, max(8, round(rng.lognormvariate(math.log(median), sigma)))) for _ in range(count)]


async def throughput(url: str, args: argparse.Namespace) -> dict[str, Any]:
    lengths = lognormal_lengths(args.requests, 200, 0.7, 1024, seed=46)
    stop = asyncio.Event()
    peak = asyncio.ensure_future(poll_batch_size(url, stop))
    async with client(url) as http:
        start = time.perf_counter()
        answers = await asyncio.gather(*(stream(http, start, chat(QUESTIONS[i % len(QUESTIONS)] + f" ({i})"), {
            "max_new_tokens": 1024, "ignore_eos": True, "do_sample": False}, stop_after=n)
            for i, n in enumerate(lengths)))
        seconds = max(a.end_s for a in answers)
    stop.set()
    ttfts = sorted(a.ttft_s for a in answers if a.ttft_s is not None)
    tokens = sum(a.tokens for a in answers)
    return {"requests": len(answers), "ok": sum(a.status == 200 for a in answers), "tokens": tokens,
            "wanted_tokens": sum(lengths), "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1),
            "ttft_p50_s": round(statistics.median(ttfts), 3), "ttft_p99_s": round(percentile(ttfts, 0.99), 3),
            "peak_running": max(await peak)}


async def chat_stream(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """--clients closed-loop clients for --duration s; see the module's docstring ("chat")."""
    stop = asyncio.Event()
    peak = asyncio.ensure_future(poll_batch_size(url, stop))
    requests: list[Progress] = []

    async def one_client(http: httpx.AsyncClient, start: float, index: int) -> None:
        lengths = lognormal_lengths(1000, 200, 0.7, 1024, seed=4600 + index)
        for turn, n in enumerate(lengths):
            progress = Progress(time.perf_counter() - start, [])
            requests.append(progress)
            question = chat(QUESTIONS[(index + turn) % len(QUESTIONS)] + f" ({index}.{turn})")
            await stream(http, start, question, {"max_new_tokens": 1024, "ignore_eos": True, "do_sample": False},
                         stop_after=n, progress=progress)

    async with client(url) as http:
        start = time.perf_counter()
        clients = [asyncio.ensure_future(one_client(http, start, i)) for i in range(args.clients)]
        await asyncio.sleep(args.duration)
        for task in clients:  # closes the open streams: the server ends those requests
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    stop.set()
    sizes = await peak
    end = args.duration
    window = [t for r in requests for t in r.token_s if args.warmup <= t < end]
    ttfts = sorted((r.token_s[0] if r.token_s else end) - r.sent_s for r in requests)
    return {"clients": args.clients, "window_s": [args.warmup, end], "requests_sent": len(requests),
            "answered": sum(bool(r.token_s) for r in requests), "window_tokens": len(window),
            "tokens_per_s": round(len(window) / (end - args.warmup), 1),
            "ttft_p50_s": round(statistics.median(ttfts), 3), "ttft_p99_s": round(percentile(ttfts, 0.99), 3),
            "running_mean": round(statistics.mean(sizes), 1), "peak_running": max(sizes),
            "preemptions": await preemptions(url)}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]


def long_prompt(index: int, tokenizer: Tokenizer, tokens: int) -> str:
    """A distinct prompt of about `tokens` tokens (no two share a prefix beyond the template's)."""
    rng = random.Random(index)
    words = ["river", "stone", "lamp", "garden", "window", "cloud", "engine", "paper", "silver", "forest"]
    body = f"Document {index}: "
    while len(tokenizer.encode(chat(body)).ids) < tokens:
        body += " ".join(rng.choice(words) for _ in range(20)) + ". "
    return chat(body + "Summarize the document.")


async def priority(url: str, args: argparse.Namespace) -> dict[str, Any]:
    tokenizer = Tokenizer.from_file(str(Path(args.model_id) / "tokenizer.json"))
    prompts = [long_prompt(i, tokenizer, 850) for i in range(14)]
    low = {"max_new_tokens": 50, "ignore_eos": True, "do_sample": False, "priority": 10}
    async with client(url) as http:
        # The floor: such a prompt's prefill on the idle server (a prompt of its own: nothing cached).
        alone = await stream(http, time.perf_counter(), prompts[13], {**low, "max_new_tokens": 1})
        start = time.perf_counter()
        background = [asyncio.ensure_future(stream(http, start, p, low)) for p in prompts[:12]]
        await asyncio.sleep(args.priority_after)
        urgent = await stream(http, start, prompts[12], {**low, "priority": 0})
        answers = await asyncio.gather(*background)
    median = statistics.median(a.ttft_s for a in answers if a.ttft_s is not None)
    assert urgent.ttft_s is not None
    return {"ok": sum(a.status == 200 for a in answers) + (urgent.status == 200), "low_ttft_median_s": round(median, 3),
            "priority_ttft_s": round(urgent.ttft_s, 3), "ratio": round(urgent.ttft_s / median, 3),
            "alone_ttft_s": round(alone.ttft_s or math.nan, 3),
            # The others were all sent at the start, the urgent one --priority-after later: the steps it waited behind.
            "low_ttfts_s": sorted(round(a.ttft_s, 2) for a in answers if a.ttft_s is not None)}


SCENARIOS = {
    # name: (load, KV budget in tokens (None: computed), launch arguments of this checkout only)
    "concurrency": (concurrency, 4096, []),
    "throughput": (throughput, None, []),
    "chat": (chat_stream, None, []),
    "priority": (priority, 4096, ["--scheduling-policy", "priority"]),
}


def budget_admitting(count: int, model_dir: str, max_new: int, block_size: int = 16) -> int:
    """The KV tokens (reserved block 0 included) that hold `count` requests of the throughput load when each
    holds input + max_new - 1 from admission, as the older checkout allocates: one more would not fit."""
    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    longest = max(len(tokenizer.encode(chat(q + " (99)")).ids) for q in QUESTIONS)
    per_request = math.ceil((longest + max_new - 1) / block_size)
    return (count * per_request + 1) * block_size


def serve_and_measure(name: str, checkout: Path, scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    load, budget, own_args = SCENARIOS[scenario]
    budget = budget if budget is not None else budget_admitting(8, args.model_id, 1024)
    port = free_port()
    env = repo_env()
    env["PYTHONPATH"] = str(checkout)  # `python -m` imports from its working directory first: run it there too
    command = [sys.executable, "-m", "tgictl", "launch", "--model-id", args.model_id, "--port", str(port),
               "--max-batch-total-tokens", str(budget), "--max-concurrent-requests", "256", *args.launch_arg]
    if checkout == REPO_ROOT:
        command += own_args
    url = f"http://127.0.0.1:{port}"
    with managed_server(f"tgictl-{name}", command, f"{url}/health", env=env, cwd=checkout):
        result = asyncio.run(load(url, args))
    result["kv_budget_tokens"] = budget
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-id", required=True, help="SmolLM2 as `tgictl download` converts it")
    parser.add_argument("--checkout", type=Path, required=True, help="the older checkout to compare with")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="default: all")
    parser.add_argument("--requests", type=int, default=40, help="throughput: requests, all at once")
    parser.add_argument("--clients", type=int, default=32, help="chat: clients, each one request at a time")
    parser.add_argument("--duration", type=float, default=75.0, help="chat: seconds the clients send")
    parser.add_argument("--warmup", type=float, default=15.0, help="chat: seconds before throughput is counted")
    parser.add_argument("--priority-after", type=float, default=1.0, help="priority: seconds before the urgent one")
    parser.add_argument("--launch-arg", action="append", default=[], help="one more `tgictl launch` argument (both)")
    parser.add_argument("--this-only", action="store_true", help="this checkout only (to look into it): no ratios")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for scenario in args.scenario or list(SCENARIOS):
        new = serve_and_measure("new", REPO_ROOT, scenario, args)
        if args.this_only:
            results[scenario] = {"new": new}
            print(json.dumps({scenario: results[scenario]}, indent=2), flush=True)
            continue
        old = serve_and_measure("old", args.checkout.resolve(), scenario, args)
        results[scenario] = {"new": new, "old": old}
        if scenario == "concurrency":
            results[scenario]["same_answers"] = new.pop("texts") == old.pop("texts")
        if scenario in ("throughput", "chat"):
            results[scenario]["throughput_ratio"] = round(new["tokens_per_s"] / old["tokens_per_s"], 2)
            results[scenario]["ttft_p99_ratio"] = round(new["ttft_p99_s"] / old["ttft_p99_s"], 2)
        print(json.dumps({scenario: results[scenario]}, indent=2), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
