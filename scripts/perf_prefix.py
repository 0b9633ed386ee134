"""Prefix cache end to end: time to first token of a prompt whose long prefix is cached vs cold.

Against a running server (`python -m tgictl launch --port 8080`):

    python scripts/perf_prefix.py --url http://127.0.0.1:8080 --prefix-tokens 1500 --rounds 3

Each round uses a fresh prefix (random words, so no earlier round's blocks match): the first request
(prefix + suffix A) computes everything, the second (same prefix + suffix B) should reuse the prefix's
KV blocks. TTFT is the time to the first streamed token. The router's prefix-hit counter
(`tgictl_prefix_cache_hit_tokens_total` on /metrics) shows the hits really happened. Issue 10's target: the
cached TTFT at most 15% of the cold one. Not a test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import httpx


def _prompt_of(client: httpx.Client, words: list[str], tokens: int) -> str:
    """The shortest run of `words` (space-joined) that tokenizes to at least `tokens` tokens."""
    low, high = 1, len(words)
    while low < high:
        mid = (low + high) // 2
        count = len(client.post("/tokenize", json={"inputs": " ".join(words[:mid])}).json())
        low, high = (mid + 1, high) if count < tokens else (low, mid)
    return " ".join(words[:low])


def _ttft(client: httpx.Client, prompt: str) -> float:
    """Seconds until the first streamed token event (one new token asked)."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 1}}
    start = time.perf_counter()
    with client.stream("POST", "/generate_stream", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:"):
                return time.perf_counter() - start
    raise RuntimeError("the stream ended without a token")


def _hit_tokens(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("tgictl_prefix_cache_hit_tokens_total "):
            return float(line.split()[-1])
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    vocabulary = [f"{w}{i}" for i in range(400) for w in ("river", "stone", "cloud", "amber")]
    cold, warm = [], []
    with httpx.Client(base_url=args.url, timeout=600.0) as client:
        for round_ in range(args.rounds):
            words = [rng.choice(vocabulary) for _ in range(args.prefix_tokens)]
            prefix = _prompt_of(client, words, args.prefix_tokens)
            hits_before = _hit_tokens(client)
            cold.append(_ttft(client, prefix + " Question one: what is first?"))
            warm.append(_ttft(client, prefix + " Question two: what comes last?"))
            hits = _hit_tokens(client) - hits_before
            print(
                f"round {round_}: cold {cold[-1] * 1e3:.0f} ms, cached prefix {warm[-1] * 1e3:.0f} ms "
                f"({warm[-1] / cold[-1]:.1%}), prefix-cache hit tokens {hits:.0f}",
                flush=True,
            )
    ratio = statistics.median(warm) / statistics.median(cold)
    print(
        f"median over {args.rounds}: cold {statistics.median(cold) * 1e3:.0f} ms, cached "
        f"{statistics.median(warm) * 1e3:.0f} ms = {ratio:.1%} of cold (target <= 15%); "
        f"load {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
