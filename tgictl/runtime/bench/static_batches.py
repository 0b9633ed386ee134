"""`tgictl bench --shard UDS`: static batches straight through a shard's gRPC socket, as TGI's
`text-generation-benchmark` does, with no router, scheduler or HTTP in the way.

Warmup once (it sizes the KV cache), then for every batch size: `warmups` unmeasured runs and `runs`
measured ones. A run prefills `batch_size` prompts of `sequence_length` random token ids and then runs
`decode_length` decode steps; ClearCache drops the batch after each run. The bench assigns KV blocks
itself, as the router would: request i owns contiguous blocks starting at 1 (block 0 is reserved).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from tgictl import __version__
from tgictl.config import BenchConfig
from tgictl.errors import ConfigError, GenerationError
from tgictl.proto.messages import (
    Batch,
    Info,
    Request,
    SamplingParams,
    StoppingParams,
    WarmupRequest,
)
from tgictl.runtime.bench.report import make_progress, write_json
from tgictl.runtime.bench.stats import Distribution
from tgictl.runtime.router.shard_client import ShardedClient


@dataclass(frozen=True)
class BatchFigures:
    """Measured runs of one batch size. Latencies in seconds, throughputs in tokens/s."""

    batch_size: int
    prefill_latency: Distribution  # one value per run
    prefill_throughput: Distribution  # batch_size * sequence_length / prefill latency, per run
    decode_token_latency: Distribution  # one value per decode step of every run
    decode_total_latency: Distribution  # every decode step of a run, summed, per run
    decode_throughput: Distribution  # batch_size / step latency, per decode step
    prefill_s: tuple[float, ...] = ()  # the raw samples: one prefill per measured run
    decode_steps_s: tuple[tuple[float, ...], ...] = ()  # per measured run, every decode step

    def to_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, **{
            name: getattr(self, name).to_dict()
            for name in ("prefill_latency", "prefill_throughput", "decode_token_latency", "decode_total_latency",
                         "decode_throughput")},
            "prefill_s": list(self.prefill_s), "decode_steps_s": [list(run) for run in self.decode_steps_s]}


def blocks_per_request(sequence_length: int, decode_length: int, block_size: int) -> int:
    """Blocks one request fills: the prompt and every decoded token but the last (whose KV is never
    written: max_new_tokens = decode_length + 1, the first token coming from the prefill)."""
    return math.ceil((sequence_length + decode_length) / block_size)


def static_batch(batch_id: int, batch_size: int, sequence_length: int, decode_length: int, block_size: int,
                 vocab_size: int, rng: random.Random) -> Batch:
    """`batch_size` greedy requests of random ids that ignore EOS, so every run decodes in full."""
    per_request = blocks_per_request(sequence_length, decode_length, block_size)
    requests = []
    for i in range(batch_size):
        # Every block the request writes, from the start: a static batch never asks for more.
        blocks = tuple(range(1 + i * per_request, 1 + (i + 1) * per_request))
        requests.append(Request(
            id=i,
            input_ids=tuple(rng.randrange(vocab_size) for _ in range(sequence_length)),
            sampling=SamplingParams(),
            stopping=StoppingParams(max_new_tokens=decode_length + 1, ignore_eos=True),
            blocks=blocks,
        ))
    return Batch(id=batch_id, requests=tuple(requests), max_tokens=batch_size * per_request * block_size,
                 max_blocks=per_request)


def check_capacity(config: BenchConfig, info: Info, num_blocks: int) -> None:
    """The largest batch must fit the KV cache and every sequence the model's positions."""
    positions = config.sequence_length + config.decode_length + 1
    if positions > info.max_position_embeddings:
        raise ConfigError(
            f"--sequence-length + --decode-length + 1 = {positions} exceeds the model's "
            f"max_position_embeddings ({info.max_position_embeddings})"
        )
    needed = 1 + max(config.batch_sizes) * blocks_per_request(config.sequence_length, config.decode_length,
                                                               info.block_size)
    if needed > num_blocks:
        raise ConfigError(
            f"batch size {max(config.batch_sizes)} needs {needed} KV blocks (block 0 included) but the shard "
            f"holds {num_blocks}: lower --batch-size, --sequence-length or --decode-length, or give the shard "
            "more --kv-cache-memory"
        )


async def _run(client: ShardedClient, batch: Batch, decode_length: int) -> tuple[float, list[float]]:
    """(prefill seconds, seconds of every decode step), timed at the client as a router would see them."""
    start = time.perf_counter()
    result = await client.prefill(batch, None)
    prefill = time.perf_counter() - start
    cached = result.batch
    steps: list[float] = []
    for _ in range(decode_length):
        if cached is None:
            raise GenerationError("the shard finished the batch before --decode-length steps (it ignores EOS)")
        start = time.perf_counter()
        result = await client.decode([cached])
        steps.append(time.perf_counter() - start)
        cached = result.batch
    await client.clear_cache(None)
    return prefill, steps


async def _measure(client: ShardedClient, config: BenchConfig, info: Info, batch_size: int,
                   rng: random.Random, advance: Callable[[], None]) -> BatchFigures:
    prefills: list[float] = []
    steps: list[list[float]] = []
    for run in range(config.warmups + config.runs):
        batch = static_batch(run, batch_size, config.sequence_length, config.decode_length, info.block_size,
                             info.vocab_size, rng)
        prefill, decode = await _run(client, batch, config.decode_length)
        if run >= config.warmups:
            prefills.append(prefill)
            steps.append(decode)
        advance()
    tokens = batch_size * config.sequence_length
    flat = [s for run_steps in steps for s in run_steps]
    return BatchFigures(
        batch_size=batch_size,
        prefill_latency=Distribution.of(prefills),
        prefill_throughput=Distribution.of([tokens / p for p in prefills]),
        decode_token_latency=Distribution.of(flat),
        decode_total_latency=Distribution.of([sum(run_steps) for run_steps in steps]),
        decode_throughput=Distribution.of([batch_size / s for s in flat]),
        prefill_s=tuple(prefills),
        decode_steps_s=tuple(tuple(run_steps) for run_steps in steps),
    )


def shard_table(figures: list[BatchFigures], info: Info) -> Table:
    """One column per batch size, one row per figure (latencies in ms, throughputs in tokens/s)."""
    table = Table(title=f"tgictl bench --shard: {info.model_type} {info.dtype} on {info.device_type}")
    table.add_column("figure")
    for f in figures:
        table.add_column(f"batch {f.batch_size}", justify="right")
    rows: list[tuple[str, Callable[[BatchFigures], float], float]] = [
        ("prefill latency p50 ms", lambda f: f.prefill_latency.p50, 1000.0),
        ("prefill latency p90 ms", lambda f: f.prefill_latency.p90, 1000.0),
        ("prefill latency p99 ms", lambda f: f.prefill_latency.p99, 1000.0),
        ("prefill tokens/s (mean)", lambda f: f.prefill_throughput.mean, 1.0),
        ("decode ms/token p50", lambda f: f.decode_token_latency.p50, 1000.0),
        ("decode ms/token p90", lambda f: f.decode_token_latency.p90, 1000.0),
        ("decode ms/token p99", lambda f: f.decode_token_latency.p99, 1000.0),
        ("decode total ms (mean)", lambda f: f.decode_total_latency.mean, 1000.0),
        ("decode tokens/s (mean)", lambda f: f.decode_throughput.mean, 1.0),
    ]
    for name, value, scale in rows:
        table.add_row(name, *(f"{value(f) * scale:.2f}" for f in figures))
    return table


async def run_shard_bench(config: BenchConfig, console: Console) -> dict[str, Any]:
    """Warm the shard up, measure every batch size, print the table; writes `config.output` when set."""
    assert config.shard_uds_path is not None
    client = await ShardedClient.connect(config.shard_uds_path)
    try:
        await client.clear_cache(None)
        info = await client.info()
        largest = max(config.batch_sizes)
        probe = static_batch(0, largest, config.sequence_length, 0, info.block_size, info.vocab_size,
                             random.Random(config.seed))
        # Warmup takes requests without blocks (the shard places its probe) and sizes the KV cache.
        bare = tuple(Request(r.id, r.input_ids, r.sampling, StoppingParams(1, ignore_eos=True)) for r in probe.requests)
        warm = await client.warmup(WarmupRequest(Batch(0, bare), max_prefill_tokens=largest * config.sequence_length))
        check_capacity(config, info, warm.max_supported_total_tokens // info.block_size)
        rng = random.Random(config.seed)
        figures = []
        with make_progress(console) as progress:
            for batch_size in config.batch_sizes:
                task = progress.add_task(f"batch {batch_size}", total=config.warmups + config.runs, status="")
                figures.append(await _measure(client, config, info, batch_size, rng,
                                              lambda: progress.update(task, advance=1)))
    finally:
        await client.close()
    console.print(shard_table(figures, info))
    document = {
        "tgictl_version": __version__, "mode": "shard",
        "info": info.__dict__ | {"eos_token_ids": list(info.eos_token_ids)},
        "settings": {"sequence_length": config.sequence_length, "decode_length": config.decode_length,
                     "runs": config.runs, "warmups": config.warmups, "batch_sizes": list(config.batch_sizes),
                     "seed": config.seed},
        "batches": [f.to_dict() for f in figures],
    }
    if config.output is not None:
        write_json(config.output, document)
    return document
