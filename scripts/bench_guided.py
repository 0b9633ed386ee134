"""Guided generation costs on a real model, as ratios against a peer measured in the same run.

    python scripts/bench_guided.py --model-id DIR --part http      # 32 concurrent JSON-schema chats vs unconstrained
    python scripts/bench_guided.py --model-id DIR --part forced    # forced tokens on vs off, in-process shard

`http` launches `tgictl launch` on the model and runs, --rounds times taking turns, 32 concurrent
clients each sending --requests-per-client chat requests: once with a JSON schema
(tgictl.testing.grammar_cases, round-robin), once unconstrained with `ignore_eos` and max_tokens set
to the constrained run's mean length, so both loads generate about the same tokens from the same
prompts. It prints output tokens/s of both, their ratio (median over rounds) and the share of
answers that parse and validate among those that ended by the grammar's own end.

`forced` runs the shard's ModelRunner in this process on 32 requests with the long-keys schema (greedy,
prompts of --prompt-len tokens), with forced tokens and without (after one unmeasured warm-up run of
each), and prints tokens/s, decode steps, and the mask cost per step (worker time and what the step
waited for it after the forward).
Not a test: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_common import free_port, managed_server, repo_env  # noqa: E402
from tgictl.testing.grammar_cases import SCHEMAS  # noqa: E402

BOUNDED = [name for name in SCHEMAS if name != "any_object"]
QUESTION = "Describe a customer order as a JSON object. Request number {i}."


async def _chat_load(url: str, bodies: list[dict[str, Any]], concurrency: int) -> tuple[list[dict[str, Any]], float]:
    queue = list(enumerate(bodies))
    answers: list[dict[str, Any]] = [{} for _ in bodies]
    async with httpx.AsyncClient(base_url=url, timeout=1200.0) as client:
        async def worker() -> None:
            while queue:
                i, body = queue.pop(0)
                response = await client.post("/v1/chat/completions", json=body)
                if response.status_code != 200:
                    raise SystemExit(f"request {i} failed: {response.status_code} {response.text}")
                answers[i] = response.json()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return answers, time.perf_counter() - start


def _valid(answer: dict[str, Any], schema: dict[str, Any]) -> bool | None:
    """True/False when the answer ended by the grammar's end; None when cut by length."""
    import jsonschema

    choice = answer["choices"][0]
    if choice["finish_reason"] != "stop":
        return None
    try:
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def part_http(args: argparse.Namespace) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "tgictl", "launch", "--model-id", str(args.model_id), "--port", str(port),
               "--max-concurrent-requests", "256"]
    n = args.concurrency * args.requests_per_client
    ratios, constrained_rates, free_rates, validity = [], [], [], []
    with managed_server("tgictl", command, f"{url}/health", env=repo_env()):
        for round_ in range(args.rounds):
            names = [BOUNDED[i % len(BOUNDED)] for i in range(n)]
            messages = [[{"role": "user", "content": QUESTION.format(i=i + round_ * n)}] for i in range(n)]
            constrained = [{"model": "tgi", "messages": m, "max_tokens": args.max_tokens, "temperature": 0,
                            "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name][0]}}}
                           for m, name in zip(messages, names)]
            answers, seconds = asyncio.run(_chat_load(url, constrained, args.concurrency))
            tokens = sum(a["usage"]["completion_tokens"] for a in answers)
            mean_len = max(1, round(tokens / n))
            checks = [_valid(a, SCHEMAS[name][0]) for a, name in zip(answers, names)]
            validity.append((sum(c is True for c in checks), sum(c is not None for c in checks)))
            messages = [[{"role": "user", "content": QUESTION.format(i=i + round_ * n + 10**6)}] for i in range(n)]
            free = [{"model": "tgi", "messages": m, "max_tokens": mean_len, "temperature": 0, "ignore_eos": True}
                    for m in messages]
            free_answers, free_seconds = asyncio.run(_chat_load(url, free, args.concurrency))
            free_tokens = sum(a["usage"]["completion_tokens"] for a in free_answers)
            constrained_rates.append(tokens / seconds)
            free_rates.append(free_tokens / free_seconds)
            ratios.append(constrained_rates[-1] / free_rates[-1])
            print(f"round {round_}: constrained {tokens} tokens in {seconds:.1f} s = {constrained_rates[-1]:.1f} tok/s "
                  f"(mean {mean_len} tokens); unconstrained {free_tokens} in {free_seconds:.1f} s = "
                  f"{free_rates[-1]:.1f} tok/s; ratio {ratios[-1]:.3f}; valid {validity[-1][0]}/{validity[-1][1]} "
                  f"of those ended by the grammar ({n - validity[-1][1]} cut by max_tokens)")
    print(json.dumps({
        "concurrency": args.concurrency, "requests_per_round": n,
        "constrained_tok_s_median": statistics.median(constrained_rates),
        "unconstrained_tok_s_median": statistics.median(free_rates),
        "ratio_median": statistics.median(ratios),
        "valid": [sum(v[0] for v in validity), sum(v[1] for v in validity)],
        "load_1min": os.getloadavg()[0],
    }, indent=1))


def part_forced(args: argparse.Namespace) -> None:
    import torch

    from tgictl.proto.messages import Batch, Grammar, GrammarType, Request, SamplingParams, StoppingParams
    from tgictl.runtime.guidance import json_schema_grammar
    from tgictl.runtime.shard.batch import ShardBatch
    from tgictl.runtime.shard.dist import DistContext
    from tgictl.runtime.shard.kv_cache import KVCache
    from tgictl.runtime.shard.models.registry import load_model
    from tgictl.runtime.shard.sampling.grammar import GrammarCompiler
    from tgictl.runtime.shard.step import ModelRunner

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    dist = DistContext.single()
    model = load_model(args.model_id, dtype=dtype, device=torch.device("cpu"), dist=dist)
    config = model.config
    grammars = GrammarCompiler(args.model_id, config.vocab_size, tuple(config.eos_token_ids))
    block, new = 16, args.max_tokens
    per = -(-(args.prompt_len + new) // block)
    cache = KVCache.for_model(config, world_size=1, num_blocks=1 + args.concurrency * per, block_size=block,
                              dtype=dtype, device=torch.device("cpu"))
    grammar = Grammar(GrammarType.LLGUIDANCE, json_schema_grammar(SCHEMAS["long_keys"][0], strict=True))
    gen = torch.Generator().manual_seed(0)
    prompts = [tuple(torch.randint(0, config.vocab_size, (args.prompt_len,), generator=gen).tolist())
               for _ in range(args.concurrency)]

    def run(forced: bool) -> dict[str, float]:
        runner = ModelRunner(model, cache, block_size=block, dist=dist, device=torch.device("cpu"),
                             grammars=grammars, forced_tokens=forced)
        requests = []
        for r, ids in enumerate(prompts):
            blocks = tuple(range(1 + r * per, 1 + (r + 1) * per))
            requests.append(Request(id=r, input_ids=ids, sampling=SamplingParams(grammar=grammar),
                                    stopping=StoppingParams(max_new_tokens=new), blocks=blocks))
        batch: ShardBatch | None = ShardBatch.from_batch(
            Batch(id=1, requests=tuple(requests)), block_size=block, num_blocks=cache.num_blocks,
            vocab_size=config.vocab_size, device=torch.device("cpu"), grammars=grammars)
        generations, batch, _ = runner.generate_token(batch)  # prefill: not timed
        tokens, steps, compute, wait = 0, 0, [], []
        texts: dict[int, list[int]] = {g.request_id: list(g.tokens.ids) for g in generations}
        start = time.perf_counter()
        while batch is not None:
            generations, batch, _ = runner.generate_token(batch)
            steps += 1
            for g in generations:
                tokens += len(g.tokens.ids)
                texts[g.request_id].extend(g.tokens.ids)
            if runner.last_masks is not None:
                compute.append(runner.last_masks.compute_s)
                wait.append(runner.last_masks.wait_s)
        seconds = time.perf_counter() - start
        return {"tok_s": tokens / seconds, "tokens": tokens, "steps": steps, "seconds": seconds,
                "mask_compute_ms": 1000 * statistics.mean(compute), "mask_wait_ms": 1000 * statistics.mean(wait),
                "mean_len": statistics.mean(len(t) for t in texts.values())}

    results: dict[str, list[dict[str, float]]] = {"forced": [], "sampled": []}
    run(True), run(False)  # warm-up, not counted: oneDNN builds a kernel per new matmul shape once
    for _ in range(args.rounds):  # taking turns
        results["forced"].append(run(True))
        results["sampled"].append(run(False))
    for name, runs in results.items():
        best = sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]
        print(f"{name:>8}: {best['tok_s']:.1f} tok/s ({best['tokens']} tokens in {best['steps']} decode steps, "
              f"{best['seconds']:.2f} s; mean answer {best['mean_len']:.1f} tokens); masks per step: worker "
              f"{best['mask_compute_ms']:.2f} ms, waited {best['mask_wait_ms']:.3f} ms")
    gain = statistics.median(f["tok_s"] / s["tok_s"] for f, s in zip(results["forced"], results["sampled"]))
    print(json.dumps({"forced_over_sampled_tok_s_median": gain, "load_1min": os.getloadavg()[0]}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-id", type=Path, required=True)
    parser.add_argument("--part", choices=("http", "forced"), required=True)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    part_http(args) if args.part == "http" else part_forced(args)


if __name__ == "__main__":
    main()
