"""Prometheus metrics of one router: TGI's `tgi_*` names (router/src/server.rs and backends/v3) plus tgictl's KV-cache figures.

Every RouterMetrics owns its CollectorRegistry, so two apps in one process (tests) never share or
collide; nothing lives at module level.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from tgictl.config import BASE_MODEL_LABEL
from tgictl.runtime.router.request import EndEvent

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
FAILURE_KINDS = ("validation", "overloaded", "generation", "incomplete", "dropped", "template")


def duration_buckets() -> list[float]:
    """TGI's buckets for every `*duration` metric: 35 geometric steps from 0.15 ms, x1.5 each."""
    return [0.00015 * 1.5**i for i in range(35)]


def linear_buckets(limit: int, count: int = 100) -> list[float]:
    """`count` equal buckets up to `limit` (TGI: input_length by max_input_tokens, ...)."""
    step = max(limit / count, 1.0)
    return [step * (i + 1) for i in range(count)]


class RouterMetrics:
    def __init__(self, *, max_input_tokens: int, max_total_tokens: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        durations = duration_buckets()
        # Requests (router/src/server.rs, infer/mod.rs).
        self.request_count = Counter("tgi_request_count", "Requests received", registry=r)
        self.request_success = Counter("tgi_request_success", "Requests that ended normally", registry=r)
        self.request_failure = Counter("tgi_request_failure", "Requests that failed", ["err"], registry=r)
        self.request_duration = Histogram(
            "tgi_request_duration", "Request wall time (s)", buckets=durations, registry=r
        )
        self.validation_duration = Histogram(
            "tgi_request_validation_duration", "Validation time (s)", buckets=durations, registry=r
        )
        self.queue_duration = Histogram(
            "tgi_request_queue_duration", "Time waiting in the queue (s)", buckets=durations, registry=r
        )
        self.inference_duration = Histogram(
            "tgi_request_inference_duration", "Time from scheduling to the end (s)", buckets=durations, registry=r
        )
        self.time_per_token = Histogram(
            "tgi_request_mean_time_per_token_duration", "Mean time per generated token (s)",
            buckets=durations, registry=r,
        )
        self.generated_tokens = Histogram(
            "tgi_request_generated_tokens", "Generated tokens per request",
            buckets=linear_buckets(max_total_tokens), registry=r,
        )
        self.input_length = Histogram(
            "tgi_request_input_length", "Prompt tokens per request",
            buckets=linear_buckets(max_input_tokens), registry=r,
        )
        self.max_new_tokens = Histogram(
            "tgi_request_max_new_tokens", "max_new_tokens per request",
            buckets=linear_buckets(max_total_tokens), registry=r,
        )
        self.skipped_tokens = Histogram(
            "tgi_request_skipped_tokens", "Accepted speculative tokens per request and step (decode steps saved)",
            buckets=[0.0, 1.0, 2.0, 4.0, 8.0], registry=r,
        )
        # Batches (backends/v3/src/backend.rs).
        self.batch_count = Counter(
            "tgi_batch_inference_count", "Shard steps", ["method"], registry=r
        )
        self.batch_success = Counter(
            "tgi_batch_inference_success", "Shard steps that succeeded", ["method"], registry=r
        )
        self.batch_failure = Counter(
            "tgi_batch_inference_failure", "Shard steps that failed", ["method"], registry=r
        )
        self.batch_concat = Counter(
            "tgi_batch_concat", "Running batches extended with new requests", ["reason"], registry=r
        )
        self.queue_size = Gauge("tgi_queue_size", "Requests waiting", registry=r)
        self.batch_current_size = Gauge("tgi_batch_current_size", "Requests in the running batch", registry=r)
        self.batch_current_max_tokens = Gauge(
            "tgi_batch_current_max_tokens", "KV tokens the running batch may use", registry=r
        )
        self.batch_max_total_tokens = Gauge(
            "tgi_batch_max_total_tokens", "KV tokens the shards hold (from warmup)", registry=r
        )
        self.batch_next_size = Histogram(
            "tgi_batch_next_size", "Requests per new batch",
            buckets=[float(2**i) for i in range(11)], registry=r,
        )
        self.batch_inference_duration = Histogram(
            "tgi_batch_inference_duration", "Shard step as the router sees it (s)", ["method"],
            buckets=durations, registry=r,
        )
        self.batch_forward_duration = Histogram(
            "tgi_batch_forward_duration", "Model forward and sampling (s)", ["method"],
            buckets=durations, registry=r,
        )
        self.batch_decode_duration = Histogram(
            "tgi_batch_decode_duration", "Shard bookkeeping after the forward (s)", ["method"],
            buckets=durations, registry=r,
        )
        self.batch_filter_duration = Histogram(
            "tgi_batch_filter_duration", "FilterBatch calls (s)", ["method"], buckets=durations, registry=r
        )
        self.batch_concat_duration = Histogram(
            "tgi_batch_concat_duration", "Batch concatenation on the shard (s)", ["method"],
            buckets=durations, registry=r,
        )
        # tgictl's KV cache figures (router/block_allocator, router/radix).
        self.kv_blocks_total = Gauge("tgictl_kv_blocks_total", "Usable KV blocks (block 0 excluded)", registry=r)
        self.kv_blocks_free = Gauge("tgictl_kv_blocks_free", "KV blocks on the free list", registry=r)
        self.kv_blocks_cached = Gauge(
            "tgictl_kv_blocks_cached", "KV blocks held only by the prefix cache (evictable)", registry=r
        )
        self.prefix_cache_hit_tokens = Counter(
            "tgictl_prefix_cache_hit_tokens", "Prompt tokens whose KV came from the prefix cache", registry=r
        )
        self.speculative_draft_tokens = Counter(
            "tgictl_speculative_draft_tokens", "Draft tokens the shards verified (--speculate)", registry=r
        )
        self.speculative_accepted_tokens = Counter(
            "tgictl_speculative_accepted_tokens", "Draft tokens accepted: the output contains them", registry=r
        )
        self.prompt_tokens = Counter(
            "tgictl_prompt_tokens", "Prompt tokens of prefilled requests (cache hits included)", registry=r
        )
        # Per LoRA adapter ("base": no adapter), docs/architecture.md, "Multi-LoRA".
        self.adapter_requests = Counter(
            "tgictl_adapter_requests", "Generation requests queued, by LoRA adapter", ["adapter"], registry=r
        )
        self.adapter_prompt_tokens = Counter(
            "tgictl_adapter_prompt_tokens", "Prompt tokens of queued requests, by LoRA adapter", ["adapter"], registry=r
        )
        self.adapter_generated_tokens = Counter(
            "tgictl_adapter_generated_tokens", "Tokens generated by requests that ended normally, by LoRA adapter",
            ["adapter"], registry=r,
        )
        for kind in FAILURE_KINDS:  # exported at 0 from the start, so rates work before the first failure
            self.request_failure.labels(err=kind)
        for method in ("prefill", "decode"):
            self.batch_count.labels(method=method)
            self.batch_success.labels(method=method)
            self.batch_failure.labels(method=method)

    def export_adapters(self, names: Sequence[str]) -> None:
        """Every adapter's counters exist at 0 from the start."""
        for name in (BASE_MODEL_LABEL, *names):
            self.adapter_requests.labels(adapter=name)
            self.adapter_prompt_tokens.labels(adapter=name)
            self.adapter_generated_tokens.labels(adapter=name)

    def observe_queued(self, adapter: str | None, prompt_tokens: int) -> None:
        label = adapter or BASE_MODEL_LABEL
        self.adapter_requests.labels(adapter=label).inc()
        self.adapter_prompt_tokens.labels(adapter=label).inc(prompt_tokens)

    def watch(
        self,
        *,
        queue_size: Callable[[], float],
        kv_total: Callable[[], float],
        kv_free: Callable[[], float],
        kv_cached: Callable[[], float],
        preemptions: Callable[[], float] = lambda: 0,
        waiting_priorities: Callable[[], Iterable[int]] = tuple,
    ) -> None:
        """Gauges read at scrape time from the live objects (no bookkeeping to drift)."""
        self.queue_size.set_function(queue_size)
        self.kv_blocks_total.set_function(kv_total)
        self.kv_blocks_free.set_function(kv_free)
        self.kv_blocks_cached.set_function(kv_cached)
        self.registry.register(_SchedulerFigures(preemptions, waiting_priorities))

    def observe_end(self, request_s: float, end: EndEvent, adapter: str | None = None) -> None:
        """A request that ended normally, `request_s` after it was admitted."""
        self.request_success.inc()
        self.adapter_generated_tokens.labels(adapter=adapter or BASE_MODEL_LABEL).inc(end.generated_tokens)
        self.request_duration.observe(request_s)
        self.queue_duration.observe(end.queued_s)
        self.inference_duration.observe(end.inference_s)
        self.generated_tokens.observe(end.generated_tokens)
        if end.generated_tokens > 0:
            self.time_per_token.observe(end.inference_s / end.generated_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SchedulerFigures(Collector):
    """Read from the scheduler at scrape time: preemptions so far (KV blocks ran out: a request gave its blocks
    back and resumed later, docs/architecture.md, "Scheduling") and the waiting requests per priority (one
    series per priority that has any: 0 for all under --scheduling-policy fcfs)."""

    def __init__(self, preemptions: Callable[[], float], waiting_priorities: Callable[[], Iterable[int]]) -> None:
        self._preemptions = preemptions
        self._waiting_priorities = waiting_priorities

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield CounterMetricFamily(
            "tgictl_request_preemptions", "Running requests preempted because the KV cache had no block for "
            "their next step (each resumes later where it stopped)", value=self._preemptions(),
        )
        waiting = GaugeMetricFamily("tgictl_queue_size_by_priority", "Requests waiting, by their priority",
                                    labels=["priority"])
        for priority, count in sorted(Tally(self._waiting_priorities()).items()):
            waiting.add_metric([str(priority)], count)
        yield waiting
