"""`tgictl bench --url`: the load generator. Build the workload once, then for every load level (a
concurrency sweep or request rates): scrape /metrics, send the requests with live progress, scrape
again, summarize. Returns the JSON document (config, per-request records, summaries).

The shard micro-benchmark (`--shard`) lives in bench_shard.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from tgictl import __version__
from tgictl.config import BenchConfig
from tgictl.errors import ConfigError, ModelNotFoundError
from tgictl.log import get_logger
from tgictl.runtime.bench.client import ApiSettings, RequestRecord, auth_headers, send
from tgictl.runtime.bench.load_shapes import LoadPlan, run_load
from tgictl.runtime.bench.html_report import write_report
from tgictl.runtime.bench.report import (
    json_safe,
    latency_table,
    make_progress,
    throughput_table,
    write_json,
)
from tgictl.runtime.bench.server_metrics import MetricsPoller, scrape, server_figures
from tgictl.runtime.bench.summary import RunSummary, summarize
from tgictl.runtime.bench.workloads import (
    BenchPrompt,
    PromptMaker,
    cycle,
    file_workload,
    random_workload,
    shared_prefix_workload,
)
from tgictl.runtime.router.text.tokenizer import RouterTokenizer

log = get_logger(__name__)
DEFAULT_RANDOM_REQUESTS = 100
DEFAULT_OUTPUT_LEN = (128, 128)
# Warm-up prompts come from another seed, so they neither repeat a measured prompt (a full
# prefix-cache hit) nor change the measured workload.
_WARMUP_SEED_OFFSET = 1_000_003
# Each run of a sweep draws fresh prompts (same lengths, another seed): a run must not find the
# previous run's prompts in the prefix cache.
_RUN_SEED_STRIDE = 7919


def load_tokenizer(name: str, allow_download: bool = True) -> RouterTokenizer:
    """A directory holding tokenizer.json as is; anything else resolves like a model id."""
    local = Path(name).expanduser()
    if (local / "tokenizer.json").is_file():
        return RouterTokenizer(local)
    from tgictl.runtime.model_files.resolve import (
        resolve_model,  # only when needed: it may convert the default model
    )

    return RouterTokenizer(resolve_model(name, allow_download=allow_download))


async def server_info(client: httpx.AsyncClient) -> dict[str, Any] | None:
    """What a TGI-compatible server says about itself (/info), else None."""
    try:
        response = await client.get("/info")
        info = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return info if isinstance(info, dict) else None


async def server_model_id(client: httpx.AsyncClient) -> str | None:
    """The model a TGI-compatible server says it serves (/info), else None."""
    model_id = (await server_info(client) or {}).get("model_id")
    return model_id if isinstance(model_id, str) else None


async def openai_model_name(client: httpx.AsyncClient) -> str | None:
    """The first model an OpenAI-compatible server lists (/v1/models): the name it routes by. A gateway
    (SMG) or vLLM has no /info, and a gateway refuses a `model` no worker serves."""
    try:
        response = await client.get("/v1/models")
        listed = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    first = listed[0] if isinstance(listed, list) and listed and isinstance(listed[0], dict) else {}
    name = first.get("id")
    return name if isinstance(name, str) else None


async def _tokenizer(config: BenchConfig, client: httpx.AsyncClient) -> RouterTokenizer | None:
    name = config.tokenizer or config.model_id
    if name is not None:
        return load_tokenizer(name)
    served = await server_model_id(client) or await openai_model_name(client)
    if served is None:
        return None
    try:
        # Only what this machine already has: a whole model download for a tokenizer nobody asked
        # for would be a surprise.
        return load_tokenizer(served, allow_download=False)
    except (ModelNotFoundError, ConfigError) as err:
        log.warning("no tokenizer for the served model %r (%s); pass --tokenizer", served, err)
        return None


async def _check_reachable(client: httpx.AsyncClient, url: str) -> None:
    """Fail at once on a wrong --url, instead of a run where every request failed. Any HTTP answer
    will do (OpenAI-compatible servers may have no /health)."""
    try:
        await client.get("/health", timeout=10.0)
    except httpx.TransportError as err:
        raise ConfigError(f"cannot reach --url {url}: {type(err).__name__}: {err}") from None


def build_workload(config: BenchConfig, maker: PromptMaker | None, count: int, seed: int) -> list[BenchPrompt]:
    output_len = config.output_len or DEFAULT_OUTPUT_LEN
    if config.workload == "file":
        assert config.dataset is not None  # BenchConfig checks it
        return file_workload(config.dataset, maker, None, config.output_len, DEFAULT_OUTPUT_LEN, seed)
    if maker is None:
        raise ConfigError(
            f"the {config.workload} workload needs the model's tokenizer for exact token lengths: "
            "pass --tokenizer or --model-id (the server did not name a model this machine has)"
        )
    if config.workload == "shared-prefix":
        return shared_prefix_workload(maker, config.groups, config.prompts_per_group, config.prefix_len,
                                      config.input_len, output_len, seed)
    return random_workload(maker, count, config.input_len, output_len, seed)


def plans(config: BenchConfig, workload_size: int) -> list[LoadPlan]:
    """One plan per load level; without --num-requests or --duration a run sends the workload once."""
    count = config.num_requests
    if count is None and config.duration_s is None:
        count = workload_size
    if config.request_rate:
        return [LoadPlan(request_rate=r, num_requests=count, duration_s=config.duration_s, seed=config.seed)
                for r in config.request_rate]
    return [LoadPlan(concurrency=c, num_requests=count, duration_s=config.duration_s, seed=config.seed)
            for c in config.concurrency]


def _status(records: list[RequestRecord]) -> str:
    failed = sum(1 for r in records if not r.ok)
    tokens = sum(r.output_tokens for r in records if r.ok)
    return f"{tokens} tokens out, {failed} errors"


async def _run_one(client: httpx.AsyncClient, settings: ApiSettings, prompts: list[BenchPrompt], plan: LoadPlan,
                   config: BenchConfig, console: Console) -> tuple[RunSummary, list[RequestRecord]]:
    run_start = time.perf_counter()
    done: list[RequestRecord] = []
    before = await scrape(client)
    poller = MetricsPoller(client, config.metrics_interval_s)
    with make_progress(console) as progress:
        task = progress.add_task(plan.label, total=plan.num_requests, status="")

        def on_done(record: RequestRecord) -> None:
            done.append(record)
            progress.update(task, advance=1, status=_status(done))

        poller.start()
        try:
            records, duration = await run_load(
                plan, lambda i: send(client, settings, cycle(prompts, i), i, run_start), on_done
            )
        finally:
            during = await poller.stop()
    after = await scrape(client)
    figures = server_figures(before, after, during) if before and after else None
    return summarize(plan.label, records, duration, dict(config.slo), figures), records


async def run_http_bench(config: BenchConfig, console: Console) -> dict[str, Any]:
    """Every run of the config against `config.url`; writes `config.output` when set."""
    assert config.url is not None
    timeout = httpx.Timeout(config.request_timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)  # the load, not the pool
    async with httpx.AsyncClient(base_url=config.url.rstrip("/"), timeout=timeout, limits=limits,
                                 headers=auth_headers(config.api_key)) as client:
        await _check_reachable(client, config.url)
        tokenizer = await _tokenizer(config, client)
        maker = PromptMaker(tokenizer) if tokenizer is not None else None
        size = config.num_requests or DEFAULT_RANDOM_REQUESTS
        prompts = build_workload(config, maker, size, config.seed)  # sizes every run of the sweep
        model = config.model_id or await openai_model_name(client) or await server_model_id(client) or "tgictl"
        settings = ApiSettings(config.api, model, config.ignore_eos)
        if config.warmup:
            warm = build_workload(config, maker, config.warmup, config.seed + _WARMUP_SEED_OFFSET)
            warm_plan = LoadPlan(concurrency=min(config.warmup, max(config.concurrency)), num_requests=config.warmup)
            start = time.perf_counter()
            await run_load(warm_plan, lambda i: send(client, settings, cycle(warm, i), i, start), lambda r: None)
        runs = []
        summaries = []
        for number, plan in enumerate(plans(config, len(prompts))):
            if number:
                prompts = build_workload(config, maker, size, config.seed + number * _RUN_SEED_STRIDE)
            summary, records = await _run_one(client, settings, prompts, plan, config, console)
            runs.append({"plan": dataclasses.asdict(plan), "summary": summary.to_dict(),
                         "requests": [r.to_dict() for r in records]})
            summaries.append(summary)
            console.print(latency_table(summary))
        console.print(throughput_table(summaries))
        info = await server_info(client)
    document = {"tgictl_version": __version__, "mode": "http", "config": _config_dict(config),
                "server_info": info, "runs": runs}
    if config.output is not None:
        write_json(config.output, document)
    if config.report is not None:
        write_report(config.report, json_safe(document))
    return document


def _config_dict(config: BenchConfig) -> dict[str, Any]:
    values = dataclasses.asdict(config)
    values.pop("api_key")  # never written out
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
