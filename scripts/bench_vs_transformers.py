"""tgictl against plain transformers on the same workload, weights and dtype, in one run.

    python scripts/bench_vs_transformers.py [--model-id ID|DIR] [--url URL] [--num-prompts 8]
        [--input-len 128] [--output-len 64] [--runs 3] [--dtype float32] [--output result.json]

The workload is `--num-prompts` random prompts of exactly `--input-len` tokens (tgictl's bench
workload), each generating exactly `--output-len` tokens greedily (EOS ignored on both sides).
Three ways to serve it, each timed end to end `--runs` times (the medians are reported):

- transformers, sequential: one `generate` per prompt, one after the other;
- transformers, static batch: one `generate` on the left-padded batch of every prompt;
- tgictl: the same prompts streamed to the server, one at a time (against sequential) and all at
  once (against the static batch: continuous batching), measured by tgictl bench's own client.

tgictl is `tgictl launch`ed by the script (and stopped at the end) unless --url names a running
server. The two sides take turns, never run together, so each has the whole machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing tgictl

from tgictl.config import DEFAULT_MODEL_ID  # noqa: E402
from tgictl.runtime.bench import load_tokenizer  # noqa: E402
from tgictl.runtime.bench_client import ApiSettings, send  # noqa: E402
from tgictl.runtime.bench_load import LoadPlan, run_load  # noqa: E402
from tgictl.runtime.bench_workloads import BenchPrompt, PromptMaker, random_workload  # noqa: E402
from tgictl.runtime.hub import resolve_model  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-id", default=DEFAULT_MODEL_ID)
    parser.add_argument("--url", default=None,
                        help="A running tgictl server of the same model (default: launch one).")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads on both sides (the launched server gets OMP_NUM_THREADS); "
                        "default: torch's.")
    parser.add_argument("--port", type=int, default=None, help="Port of the launched server (default: a free one).")
    parser.add_argument("--kv-cache-memory", default=None,
                        help="Passed to the launched server, e.g. 64MiB (default: tgictl's own budget).")
    parser.add_argument("--output", type=Path, default=None, help="Write every timing and the medians as JSON.")
    args = parser.parse_args()
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    for name in ("num_prompts", "input_len", "output_len", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def tgictl_server(args: argparse.Namespace, model_dir: Path, max_total: int) -> Iterator[str]:
    """The URL of a tgictl server: --url, or one `tgictl launch` started here and stopped on exit."""
    if args.url is not None:
        yield args.url.rstrip("/")
        return
    port = args.port or _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    if args.threads is not None:  # torch reads it at start-up, in the shard as anywhere
        env["OMP_NUM_THREADS"] = str(args.threads)
    command = [sys.executable, "-m", "tgictl", "launch", "--model-id", str(model_dir), "--port", str(port),
               "--dtype", args.dtype, "--max-total-tokens", str(max_total),
               "--max-input-tokens", str(max_total - 1)]
    if args.kv_cache_memory is not None:
        command += ["--kv-cache-memory", args.kv_cache_memory]
    # The server's log goes to a temporary file (named on failure), never into the checkout.
    log = tempfile.NamedTemporaryFile(prefix="tgictl-bench-server-", suffix=".log", delete=False)  # noqa: SIM115
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                raise SystemExit(f"tgictl launch exited with {server.returncode}; see {log.name}")
            if time.monotonic() > deadline:
                raise SystemExit(f"tgictl launch not healthy after 600 s; see {log.name}")
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
    Path(log.name).unlink()  # reached only when everything went well; otherwise the log stays to read


def transformers_sequential(model: Any, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds to generate every prompt's tokens, one `generate` after the other."""
    start = time.perf_counter()
    for ids in prompts:
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        if out.shape[1] - len(ids) != new_tokens:
            raise SystemExit("transformers generated a different number of tokens than asked")
    return time.perf_counter() - start


def transformers_batch(model: Any, prompts: list[list[int]], new_tokens: int, pad_id: int) -> float:
    """Seconds for one `generate` on the whole left-padded batch (a static batch)."""
    width = max(len(ids) for ids in prompts)
    # input_ids, attention_mask: [batch, width], padding on the left so every row ends at the same column
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in prompts])
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts])
    start = time.perf_counter()
    out = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id)
    elapsed = time.perf_counter() - start
    if out.shape[1] - width != new_tokens:
        raise SystemExit("transformers generated a different number of tokens than asked")
    return elapsed


async def tgictl_run(url: str, prompts: list[BenchPrompt], concurrency: int) -> float:
    """Seconds from the first request to the last answer; every request must give all its tokens."""
    timeout = httpx.Timeout(600.0, connect=10.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        settings = ApiSettings("tgi", "tgictl", ignore_eos=True)
        start = time.perf_counter()
        records, duration = await run_load(
            LoadPlan(concurrency=concurrency, num_requests=len(prompts)),
            lambda i: send(client, settings, prompts[i], i, start), lambda r: None,
        )
    for record in records:
        if not record.ok or record.output_tokens != prompts[record.index].max_new_tokens:
            raise SystemExit(f"tgictl request {record.index} failed: {record.error or record.output_tokens}")
    return duration


def main() -> None:
    args = parse_args()
    console = Console()
    model_dir = resolve_model(args.model_id)
    tokenizer = load_tokenizer(str(model_dir))
    workload = random_workload(PromptMaker(tokenizer), args.num_prompts, (args.input_len, args.input_len),
                               (args.output_len, args.output_len), args.seed)
    prompt_ids = [tokenizer.encode(p.text) for p in workload]  # the ids the server's router computes
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[args.dtype]).eval()
    pad_id = model.generation_config.pad_token_id or model.generation_config.eos_token_id
    pad_id = pad_id[0] if isinstance(pad_id, list) else (pad_id if pad_id is not None else 0)
    total_tokens = args.num_prompts * args.output_len
    timings: dict[str, list[float]] = {k: [] for k in ("hf_sequential", "hf_batch", "tgictl_sequential",
                                                       "tgictl_concurrent")}
    with torch.inference_mode():
        # One unmeasured pass each: first-call costs (allocations, kernel selection) are not serving.
        transformers_sequential(model, prompt_ids[:1], 2)
        transformers_batch(model, prompt_ids, 2, pad_id)
        for run in range(args.runs):
            timings["hf_sequential"].append(transformers_sequential(model, prompt_ids, args.output_len))
            timings["hf_batch"].append(transformers_batch(model, prompt_ids, args.output_len, pad_id))
            console.print(f"transformers run {run + 1}/{args.runs}: sequential {timings['hf_sequential'][-1]:.2f} s, "
                          f"static batch {timings['hf_batch'][-1]:.2f} s")
    del model  # the server gets the memory and the cores from here on
    with tgictl_server(args, model_dir, args.input_len + args.output_len + 8) as url:
        asyncio.run(tgictl_run(url, workload[:2], 2))  # warm-up, unmeasured
        for run in range(args.runs):
            timings["tgictl_sequential"].append(asyncio.run(tgictl_run(url, workload, 1)))
            timings["tgictl_concurrent"].append(asyncio.run(tgictl_run(url, workload, args.num_prompts)))
            console.print(f"tgictl run {run + 1}/{args.runs}: sequential {timings['tgictl_sequential'][-1]:.2f} s, "
                          f"all at once {timings['tgictl_concurrent'][-1]:.2f} s")
    medians = {k: statistics.median(v) for k, v in timings.items()}
    rates = {k: total_tokens / v for k, v in medians.items()}
    table = Table(title=f"{args.model_id} {args.dtype}: {args.num_prompts} prompts x {args.input_len} tokens in, "
                        f"{args.output_len} out (median of {args.runs}, {threads} torch threads)")
    for column in ("engine", "median s", "output tokens/s", "tgictl / this"):
        table.add_column(column, justify="right" if column != "engine" else "left")
    table.add_row("transformers sequential generate", f"{medians['hf_sequential']:.2f}",
                  f"{rates['hf_sequential']:.1f}", f"{rates['tgictl_sequential'] / rates['hf_sequential']:.2f}x")
    table.add_row("transformers static padded batch", f"{medians['hf_batch']:.2f}", f"{rates['hf_batch']:.1f}",
                  f"{rates['tgictl_concurrent'] / rates['hf_batch']:.2f}x")
    table.add_row("tgictl, one request at a time", f"{medians['tgictl_sequential']:.2f}",
                  f"{rates['tgictl_sequential']:.1f}", "")
    table.add_row("tgictl, all requests at once", f"{medians['tgictl_concurrent']:.2f}",
                  f"{rates['tgictl_concurrent']:.1f}", "")
    console.print(table)
    console.print(f"tgictl / transformers: sequential {rates['tgictl_sequential'] / rates['hf_sequential']:.2f}x, "
                  f"batched {rates['tgictl_concurrent'] / rates['hf_batch']:.2f}x")
    if args.output is not None:
        args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "timings_s": timings,
                                           "medians_s": medians, "output_tokens_per_s": rates,
                                           "torch_threads": threads}, indent=2) + "\n")


if __name__ == "__main__":
    main()
