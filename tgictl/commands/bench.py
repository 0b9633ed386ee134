"""`tgictl bench`: load-test a TGI- or OpenAI-compatible server (`--url`), or time static batches
straight through a shard's gRPC socket (`--shard`).

Flags → BenchConfig → runtime/bench (HTTP) or runtime/bench_shard (gRPC). Progress and tables go to
stderr/stdout through rich; with the global --json-output the summaries are printed as one JSON
document on stdout instead of tables.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from tgictl.config import BENCH_APIS, BENCH_WORKLOADS, BenchConfig, LogConfig
from tgictl.errors import ConfigError


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{name} must be comma-separated integers such as 1,8,32, got {text!r}") from None


def _floats(text: str, name: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{name} must be comma-separated numbers such as 0.5,2, got {text!r}") from None


def _summary_only(document: dict[str, Any]) -> dict[str, Any]:
    """What --json-output prints: the document without its per-request records (those go to --output)."""
    if document.get("mode") != "http":
        return document
    return document | {"runs": [{k: v for k, v in run.items() if k != "requests"} for run in document["runs"]]}


def bench(
    ctx: typer.Context,
    url: Optional[str] = typer.Option(
        None, "--url", help="Base URL of the server to load, e.g. http://127.0.0.1:8080."
    ),
    shard: Optional[str] = typer.Option(None, "--shard", help="A shard's Unix socket: gRPC micro-benchmark."),
    api: str = typer.Option("tgi", "--api", help=f"One of {', '.join(BENCH_APIS)}."),
    model_id: Optional[str] = typer.Option(
        None, "--model-id", help="Model whose tokenizer sizes prompts exactly (default: the one the server names)."
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", help="Tokenizer directory or hub id (overrides --model-id)."
    ),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Sent as a Bearer token."),
    workload: str = typer.Option("random", "--workload", help=f"One of {', '.join(BENCH_WORKLOADS)}."),
    input_len: str = typer.Option(
        "256", "--input-len", help="Prompt tokens, N or MIN:MAX (shared-prefix: after the prefix)."
    ),
    output_len: Optional[str] = typer.Option(
        None, "--output-len", show_default=False,
        help="New tokens per request, N or MIN:MAX (default 128; file: the reference replies when a "
        "tokenizer is known).",
    ),
    prefix_len: int = typer.Option(1024, "--prefix-len", help="shared-prefix: tokens of each group's system prompt."),
    groups: int = typer.Option(4, "--groups", help="shared-prefix: number of system prompts."),
    prompts_per_group: int = typer.Option(8, "--prompts-per-group", help="shared-prefix: prompts per system prompt."),
    dataset: Optional[Path] = typer.Option(
        None, "--dataset", help="file: JSONL (or a JSON array) of ShareGPT / messages / prompt objects."
    ),
    concurrency: str = typer.Option(
        "1", "--concurrency", help="Closed loop: clients, comma-separated for a sweep (1,8,32)."
    ),
    request_rate: Optional[str] = typer.Option(
        None, "--request-rate", show_default=False,
        help="Open loop: Poisson arrivals per second (comma-separated for a sweep).",
    ),
    num_requests: Optional[int] = typer.Option(
        None, "--num-requests", show_default=False, help="Requests per run (default: the workload's size; random: 100)."
    ),
    duration: Optional[float] = typer.Option(None, "--duration", show_default=False, help="Seconds per run."),
    warmup: int = typer.Option(0, "--warmup", help="Requests sent before the first run, not measured."),
    ignore_eos: bool = typer.Option(
        False, "--ignore-eos", help="Ask the server to generate past EOS (exact output lengths)."
    ),
    slo: Optional[str] = typer.Option(
        None, "--slo", show_default=False, help="Goodput bounds in seconds, e.g. ttft=0.5,tpot=0.05."
    ),
    seed: int = typer.Option(0, "--seed", help="Seeds the workload and the Poisson arrivals."),
    output: Optional[Path] = typer.Option(None, "--output", help="Write the JSON result (per-request records) here."),
    report: Optional[Path] = typer.Option(
        None, "--report", help="Write a self-contained HTML page of the runs (plots, settings, the server's /info)."
    ),
    request_timeout: float = typer.Option(600.0, "--request-timeout", help="Seconds one request may take."),
    batch_size: str = typer.Option("1,2,4,8,16,32", "--batch-size", help="--shard: batch sizes to time."),
    sequence_length: int = typer.Option(10, "--sequence-length", help="--shard: prompt tokens per request."),
    decode_length: int = typer.Option(8, "--decode-length", help="--shard: decode steps per run."),
    runs: int = typer.Option(10, "--runs", help="--shard: measured runs per batch size."),
    warmups: int = typer.Option(1, "--warmups", help="--shard: unmeasured runs per batch size."),
) -> None:
    """Benchmark a server over HTTP, or a shard over gRPC (like TGI's text-generation-benchmark)."""
    # Imported here, not at the top: every tgictl process builds the whole CLI, and these pull in the
    # HTTP client, the tokenizer and the report's libraries (~10 MiB of RSS in each shard and router).
    from tgictl.runtime.bench.report import json_safe
    from tgictl.runtime.bench.stats import parse_slo
    from tgictl.runtime.bench.workloads import parse_range

    config = BenchConfig(
        url=url, shard_uds_path=shard, api=api, model_id=model_id, tokenizer=tokenizer, api_key=api_key,
        workload=workload, input_len=parse_range(input_len, "--input-len"),
        output_len=parse_range(output_len, "--output-len") if output_len is not None else None,
        prefix_len=prefix_len, groups=groups, prompts_per_group=prompts_per_group, dataset=dataset,
        concurrency=_ints(concurrency, "--concurrency"),
        request_rate=_floats(request_rate, "--request-rate") if request_rate is not None else (),
        num_requests=num_requests, duration_s=duration, warmup=warmup, ignore_eos=ignore_eos,
        slo=tuple(parse_slo(slo).items()) if slo is not None else (), seed=seed, output=output, report=report,
        request_timeout_s=request_timeout, batch_sizes=_ints(batch_size, "--batch-size"),
        sequence_length=sequence_length, decode_length=decode_length, runs=runs, warmups=warmups,
    )
    json_output = isinstance(ctx.obj, LogConfig) and ctx.obj.json_output
    # Progress and tables on stdout, or on stderr when stdout carries the JSON document.
    console = Console(stderr=True) if json_output else Console()
    if config.shard_uds_path is not None:
        from tgictl.runtime.bench.static_batches import (
            run_shard_bench,  # grpc only for this mode
        )

        document = asyncio.run(run_shard_bench(config, console))
    else:
        from tgictl.runtime.bench.load_test import run_http_bench

        document = asyncio.run(run_http_bench(config, console))
    if json_output:
        sys.stdout.write(json.dumps(json_safe(_summary_only(document))) + "\n")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
