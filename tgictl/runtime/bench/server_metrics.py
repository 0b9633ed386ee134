"""What a tgictl server's /metrics says about a bench run: prefix-cache hits, KV-cache use, and how much of
the run the shard spent in forward passes and sampling.

A scrape before and after each run gives counter deltas (hit tokens / prompt tokens, the histograms' sums
of shard time); scrapes during the run give the peak KV use. A server without these series (TGI, vLLM,
...) simply yields None.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

HIT_TOKENS = "tgictl_prefix_cache_hit_tokens_total"
PROMPT_TOKENS = "tgictl_prompt_tokens_total"
KV_TOTAL = "tgictl_kv_blocks_total"
KV_FREE = "tgictl_kv_blocks_free"
KV_CACHED = "tgictl_kv_blocks_cached"
# Sums over prefill and decode steps (parse_samples adds label sets): the shard's forward and sampling as it
# reports them, and the whole step RPC as the router times it.
SHARD_FORWARD_S = "tgi_batch_forward_duration_sum"
SHARD_RPC_S = "tgi_batch_inference_duration_sum"


def parse_samples(text: str) -> dict[str, float]:
    """Prometheus text → {sample name: value}, summed over label sets (the series we read have none)."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + float(sample.value)
    return samples


@dataclass(frozen=True)
class KvUse:
    """KV blocks at one scrape. `cached` blocks hold only the prefix cache (evictable); `active`
    ones belong to running requests."""

    total: float
    free: float
    cached: float

    @property
    def active(self) -> float:
        return self.total - self.free - self.cached

    @classmethod
    def of(cls, samples: Mapping[str, float]) -> KvUse | None:
        if not all(name in samples for name in (KV_TOTAL, KV_FREE, KV_CACHED)):
            return None
        return cls(samples[KV_TOTAL], samples[KV_FREE], samples[KV_CACHED])


@dataclass(frozen=True)
class ServerFigures:
    """The run's deltas and peaks; None where the server does not export the series."""

    prompt_tokens: float | None
    prefix_cache_hit_tokens: float | None
    prefix_cache_hit_rate: float | None  # hit tokens / prompt tokens over the run
    kv_blocks_total: float | None
    kv_peak_active_blocks: float | None  # the most blocks running requests held at one scrape
    kv_peak_active_fraction: float | None
    kv_cached_blocks_after: float | None
    shard_forward_s: float | None = None  # forward + sampling over the run, as the shard timed it
    shard_rpc_s: float | None = None  # the step RPCs as the router timed them (forward + IPC + conversions)

    def engine_share(self, duration_s: float) -> float | None:
        """The part of a run's wall time the shard spent in forward passes and sampling; the rest is the
        router (HTTP, scheduling, detokenizing), IPC and idle time. Meaningful on a run that keeps the
        server busy from first request to last (a closed loop at a fixed concurrency)."""
        if self.shard_forward_s is None or duration_s <= 0:
            return None
        return self.shard_forward_s / duration_s

    def to_dict(self) -> dict[str, float | None]:
        return dict(self.__dict__)


def server_figures(before: Mapping[str, float], after: Mapping[str, float],
                   during: list[Mapping[str, float]]) -> ServerFigures:
    prompt = hits = hit_rate = None
    if all(name in s for s in (before, after) for name in (HIT_TOKENS, PROMPT_TOKENS)):
        prompt = after[PROMPT_TOKENS] - before[PROMPT_TOKENS]
        hits = after[HIT_TOKENS] - before[HIT_TOKENS]
        hit_rate = hits / prompt if prompt > 0 else None
    forward, rpc = (after[name] - before[name] if name in before and name in after else None
                    for name in (SHARD_FORWARD_S, SHARD_RPC_S))
    uses = [u for u in (KvUse.of(s) for s in [before, *during, after]) if u is not None]
    final = KvUse.of(after)
    if not uses:
        return ServerFigures(prompt, hits, hit_rate, None, None, None, None, forward, rpc)
    total = uses[-1].total
    peak = max(u.active for u in uses)
    return ServerFigures(prompt, hits, hit_rate, total, peak, peak / total if total > 0 else None,
                         final.cached if final is not None else None, forward, rpc)


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    """One /metrics scrape; {} when the server has no Prometheus endpoint or it fails."""
    try:
        response = await client.get("/metrics")
    except httpx.HTTPError:
        return {}
    if response.status_code != 200:
        return {}
    try:
        return parse_samples(response.text)
    except ValueError:  # not Prometheus text (some servers answer /metrics with HTML or JSON)
        return {}


class MetricsPoller:
    """Scrapes /metrics every `interval_s` while a run goes on (peak KV use)."""

    def __init__(self, client: httpx.AsyncClient, interval_s: float) -> None:
        self.client = client
        self.interval_s = interval_s
        self.samples: list[dict[str, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            samples = await scrape(self.client)
            if samples:
                self.samples.append(samples)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> list[dict[str, float]]:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        return self.samples
