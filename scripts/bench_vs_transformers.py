"""tgictl against plain transformers on the same workload, weights and dtype, in one run.

    python scripts/bench_vs_transformers.py [--scenario uniform|mixed|ttft] [--model-id ID|DIR]
        [--url URL] [--num-prompts 32] [--input-len 100] [--output-len 128|MIN:MAX]
        [--concurrency 32] [--runs 3] [--dtype bfloat16] [--output result.json]

Prompts are random text of exactly `--input-len` tokens (tgictl bench's workload); every request
generates exactly its max_new_tokens greedily, EOS ignored on both sides. Each run draws fresh
prompts (seed + run), the same for both engines, so tgictl's prefix cache never hits across runs.
Medians over `--runs` are reported. The scenarios:

- uniform: `--num-prompts` prompts, `--output-len` new tokens each. transformers: one `generate`
  per prompt one after the other (sequential, over the first `--sequential-prompts`), and one
  `generate` on the left-padded batch of all of them (static batch). tgictl: the same first prompts
  one at a time, and all of them at once.
- mixed: `--num-prompts` prompts with max_new_tokens drawn from `--output-len MIN:MAX`.
  transformers: static batches of `--concurrency` prompts in order, each generating as long as its
  longest member (what a static batch must do); only the asked tokens count. tgictl: all of them
  with `--concurrency` in flight (continuous batching).
- ttft: time to first token of one `--input-len` prompt, alone. transformers: `generate` of one
  token; tgictl: a streamed request's first token as the client sees it.

tgictl is `tgictl launch`ed by the script (and stopped at the end, also on SIGTERM) unless --url
names a running server. The two sides take turns, never run together, so each has the whole machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from bench_common import free_port, managed_server, repo_env, shard_seconds, timed_load
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM

from tgictl.config import DEFAULT_MODEL_ID
from tgictl.errors import ConfigError
from tgictl.runtime.bench.client import ApiSettings
from tgictl.runtime.bench.load_test import load_tokenizer
from tgictl.runtime.bench.workloads import (
    BenchPrompt,
    PromptMaker,
    parse_range,
    random_workload,
)
from tgictl.runtime.model_files.resolve import resolve_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULTS = {"uniform": (32, "128"), "mixed": (64, "16:256"), "ttft": (1, "1")}  # num-prompts, output-len


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="uniform", choices=sorted(DEFAULTS))
    parser.add_argument("--model-id", default=DEFAULT_MODEL_ID)
    parser.add_argument("--url", default=None,
                        help="A running tgictl server of the same model (default: launch one).")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--num-prompts", type=int, default=None, help="default: 32 uniform, 64 mixed, 1 ttft")
    parser.add_argument("--input-len", type=int, default=None, help="default: 100 (ttft: 1000)")
    parser.add_argument("--output-len", default=None, help="N or MIN:MAX (default: 128 uniform, 16:256 mixed)")
    parser.add_argument("--concurrency", type=int, default=32, help="mixed: requests in flight / static batch size")
    parser.add_argument("--sequential-prompts", type=int, default=4,
                        help="uniform: how many of the prompts the one-at-a-time modes serve (they are slow)")
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
    default_prompts, default_output = DEFAULTS[args.scenario]
    args.num_prompts = args.num_prompts or default_prompts
    args.input_len = args.input_len or (1000 if args.scenario == "ttft" else 100)
    try:
        args.output_range = parse_range(args.output_len or default_output, "--output-len")
    except ConfigError as err:
        parser.error(str(err))
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    for name in ("num_prompts", "input_len", "runs", "concurrency", "sequential_prompts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


@contextmanager
def tgictl_server(args: argparse.Namespace, model_dir: Path, max_total: int) -> Iterator[str]:
    """The URL of a tgictl server: --url, or one `tgictl launch` started here and stopped on exit."""
    if args.url is not None:
        yield args.url.rstrip("/")
        return
    port = args.port or free_port()
    command = [sys.executable, "-m", "tgictl", "launch", "--model-id", str(model_dir), "--port", str(port),
               "--dtype", args.dtype, "--max-total-tokens", str(max_total), "--max-input-tokens", str(max_total - 1)]
    if args.kv_cache_memory is not None:
        command += ["--kv-cache-memory", args.kv_cache_memory]
    url = f"http://127.0.0.1:{port}"
    with managed_server("tgictl", command, f"{url}/health", env=repo_env(args.threads)):
        yield url


def hf_generate(model: Any, prompts: list[list[int]], new_tokens: int, pad_id: int) -> float:
    """Seconds for one `generate` of `new_tokens` on the left-padded batch of `prompts` (a static batch)."""
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


def hf_modes(args: argparse.Namespace, model: Any, ids: list[list[int]], work: list[BenchPrompt],
             pad_id: int) -> dict[str, float]:
    """Seconds of each transformers mode on one run's prompts."""
    if args.scenario == "ttft":
        return {"hf": hf_generate(model, ids[:1], 1, pad_id)}
    if args.scenario == "mixed":
        total = 0.0
        for first in range(0, len(ids), args.concurrency):
            batch = work[first:first + args.concurrency]
            total += hf_generate(model, ids[first:first + args.concurrency], max(p.max_new_tokens for p in batch),
                                 pad_id)
        return {"hf_static_batches": total}
    new = work[0].max_new_tokens
    return {"hf_sequential": sum(hf_generate(model, [row], new, pad_id) for row in ids[:args.sequential_prompts]),
            "hf_batch": hf_generate(model, ids, new, pad_id)}


def tgictl_modes(args: argparse.Namespace, url: str, work: list[BenchPrompt]) -> dict[str, float]:
    settings = ApiSettings("tgi", "tgictl", ignore_eos=True)
    if args.scenario == "ttft":
        records, _ = timed_load(url, settings, work[:1], 1)
        return {"tgictl": float(records[0].ttft_s or 0.0)}
    if args.scenario == "mixed":
        return concurrent_with_share(url, settings, work, args.concurrency)
    return {"tgictl_sequential": timed_load(url, settings, work[:args.sequential_prompts], 1)[1],
            **concurrent_with_share(url, settings, work, len(work))}


def concurrent_with_share(url: str, settings: ApiSettings, work: list[BenchPrompt],
                          concurrency: int) -> dict[str, float]:
    """The concurrent run's seconds, and the share of them the shard spent in forward passes and sampling
    (from /metrics; the rest is the router, IPC, scheduling and idle time: the issue's target 4)."""
    before = shard_seconds(url)
    seconds = timed_load(url, settings, work, concurrency)[1]
    after = shard_seconds(url)
    if before is None or after is None:
        return {"tgictl_concurrent": seconds}
    return {"tgictl_concurrent": seconds, SHARE: (after - before) / seconds}


SHARE = "tgictl_concurrent_shard_share"  # a fraction, kept beside the modes' seconds

# (label, tgictl mode, transformers mode) rows of the report; ratios are tgictl's rate over transformers'
ROWS = {
    "uniform": [("sequential: tgictl one request at a time vs generate per prompt", "tgictl_sequential",
                 "hf_sequential"),
                ("concurrent: tgictl all at once vs static padded batch", "tgictl_concurrent", "hf_batch")],
    "mixed": [("mixed lengths: tgictl continuous vs static batches", "tgictl_concurrent", "hf_static_batches")],
    "ttft": [("time to first token", "tgictl", "hf")],
}


def main() -> None:
    args = parse_args()
    console = Console(width=160)
    model_dir = resolve_model(args.model_id)
    tokenizer = load_tokenizer(str(model_dir))
    maker = PromptMaker(tokenizer)
    length = (args.input_len, args.input_len)
    # one workload per run plus the warm-up's, all with distinct prompts
    works = [random_workload(maker, args.num_prompts, length, args.output_range, args.seed + run)
             for run in range(args.runs + 1)]
    ids = [[tokenizer.encode(p.text) for p in work] for work in works]  # the ids the server's router computes
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[args.dtype]).eval()
    pad_id = model.generation_config.pad_token_id or model.generation_config.eos_token_id
    pad_id = pad_id[0] if isinstance(pad_id, list) else (pad_id if pad_id is not None else 0)
    timings: dict[str, list[float]] = {}
    with torch.inference_mode():
        hf_generate(model, ids[-1][:1], 2, pad_id)  # first-call costs (allocation, kernel choice) are not serving
        for run in range(args.runs):
            for mode, seconds in hf_modes(args, model, ids[run], works[run], pad_id).items():
                timings.setdefault(mode, []).append(seconds)
            console.print(f"transformers run {run + 1}/{args.runs}: "
                          + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in timings.items()))
    del model  # the server gets the memory and the cores from here on
    max_total = args.input_len + args.output_range[1] + 8
    with tgictl_server(args, model_dir, max_total) as url:
        timed_load(url, ApiSettings("tgi", "tgictl", ignore_eos=True), works[-1][:2], 2)  # warm-up
        for run in range(args.runs):
            for mode, seconds in tgictl_modes(args, url, works[run]).items():
                timings.setdefault(mode, []).append(seconds)
            console.print(f"tgictl run {run + 1}/{args.runs}: "
                          + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in timings.items()
                                      if k.startswith("tgictl") and k != SHARE))
    medians = {k: statistics.median(v) for k, v in timings.items()}
    asked = statistics.median(sum(p.max_new_tokens for p in work) for work in works[:args.runs])
    # tokens each mode produced: the sequential modes serve only the first --sequential-prompts
    sequential = statistics.median(sum(p.max_new_tokens for p in work[:args.sequential_prompts])
                                   for work in works[:args.runs])
    table = Table(title=f"{args.model_id} {args.dtype}, {args.scenario}: {args.num_prompts} prompts x "
                        f"{args.input_len} tokens, {args.output_len or DEFAULTS[args.scenario][1]} new "
                        f"(median of {args.runs}, {threads} torch threads)")
    for column in ("comparison", "tgictl s", "transformers s", "tgictl tok/s", "transformers tok/s", "ratio"):
        table.add_column(column, justify="left" if column == "comparison" else "right")
    for label, ours, theirs in ROWS[args.scenario]:
        if args.scenario == "ttft":  # lower is better: the ratio is tgictl's time over transformers'
            table.add_row(label, f"{medians[ours]:.3f}", f"{medians[theirs]:.3f}", "", "",
                          f"{medians[ours] / medians[theirs]:.2f}x the time")
            continue
        tokens = sequential if ours == "tgictl_sequential" else asked
        table.add_row(label, f"{medians[ours]:.2f}", f"{medians[theirs]:.2f}", f"{tokens / medians[ours]:.1f}",
                      f"{tokens / medians[theirs]:.1f}", f"{medians[theirs] / medians[ours]:.2f}x")
    console.print(table)
    if SHARE in medians:
        console.print(f"tgictl concurrent runs: the shard's forward+sampling took {medians[SHARE] * 100:.1f}% of the "
                      f"wall time (median of {args.runs}); router, IPC, scheduling and idle: "
                      f"{(1 - medians[SHARE]) * 100:.1f}%")
    if args.output is not None:
        args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "timings_s": timings,
                                           "medians_s": medians, "asked_tokens": asked,
                                           "sequential_tokens": sequential,
                                           "torch_threads": threads}, indent=2) + "\n")


if __name__ == "__main__":
    main()
