"""The running router: start-up against the shards, the pieces every route uses, graceful shutdown.

Start-up follows TGI's router: connect, ClearCache(None), Info, Warmup, then the limits derived from
the warmup (scheduling/limits.py), the allocator sized from them, the queue and the batching task
(docs/architecture.md, "Processes"). A request holds one of max_concurrent_requests permits (429 when
none is left) from admission to its last event. Shutdown: stop admitting (503), let in-flight requests
finish up to the graceful timeout, then end the rest with an error event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace

from tgictl.config import BASE_MODEL_ALIASES, RouterConfig, SchedulingPolicy
from tgictl.errors import OverloadedError, TemplateError, UnhealthyError, ValidationError
from tgictl.progress import phase
from tgictl.proto.messages import Info, WarmupRequest, WarmupResult
from tgictl.runtime.router.adapters import AdapterClient, AdapterSlots, RuntimeAdapters
from tgictl.runtime.router.gateway_metrics import GatewaySources, kv_usage_fraction, register_gateway_gauges
from tgictl.runtime.router.guided.grammars import GrammarValidator
from tgictl.runtime.router.health import HealthChecker
from tgictl.runtime.router.kv.cache_events import KvEventLog
from tgictl.runtime.router.kv.prefix_allocator import create_allocator
from tgictl.runtime.router.kv_event_publisher import KvEventPublisher
from tgictl.runtime.router.metered_client import MeteredClient
from tgictl.runtime.router.metrics import RouterMetrics
from tgictl.runtime.router.request import EndEvent, StreamEvent, ValidatedRequest
from tgictl.runtime.router.request_log import RequestOrigin, log_finished
from tgictl.runtime.router.scheduling.batcher import Batcher, BatcherConfig, ShardClient
from tgictl.runtime.router.scheduling.entry import TokenTexts
from tgictl.runtime.router.scheduling.event_channel import EventChannel, events
from tgictl.runtime.router.scheduling.limits import (
    RouterLimits, derive_limits, max_batch_prefill_tokens, prefill_group_tokens, warmup_request,
)
from tgictl.runtime.router.scheduling.queue import Queue
from tgictl.runtime.router.scheduling.scheduler import release_window
from tgictl.runtime.router.text.reasoning import REASONING_FORMATS
from tgictl.runtime.router.text.tokenizer import RouterTokenizer
from tgictl.runtime.router.traced_client import TracedClient
from tgictl.runtime.router.validation import GenerationInput, ValidationLimits, Validator
from tgictl.tracing import add_finished_span, tracer

log = logging.getLogger(__name__)


class ServiceClient(ShardClient, AdapterClient, Protocol):
    """Everything the router calls on the shards (ShardedClient implements it)."""

    async def info(self) -> Info: ...

    async def health(self) -> None: ...

    async def warmup(self, request: WarmupRequest) -> WarmupResult: ...

    async def close(self) -> None: ...


class ShuttingDownError(UnhealthyError):
    """New requests while draining, and requests still running when the graceful timeout ends."""

    error_type = "shutting_down"

    def __init__(self, message: str = "the server is shutting down") -> None:
        super().__init__(message)


@dataclass
class Permits:
    """max_concurrent_requests, counted: each generation (a best_of or n choice too) holds one."""

    limit: int
    in_use: int = 0


@dataclass
class Admission:
    """One admitted generation: its concurrency permit and timings. `release()` is idempotent."""

    permits: Permits
    start: float = field(default_factory=time.monotonic)
    validation_s: float = 0.0
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.permits.in_use -= 1


def phase_spans(parent: otel_context.Context, end: EndEvent) -> None:
    """One request's scheduler phases as child spans of its request span: queue (waiting), prefill
    (first scheduling to the first token, chunks included), decode (to the end)."""
    scheduled = end.ended_at - end.inference_s
    first_token = scheduled + end.first_token_s
    add_finished_span("queue", parent, scheduled - end.queued_s, scheduled)
    add_finished_span("prefill", parent, scheduled, first_token, **{
        "gen_ai.usage.input_tokens": end.input_length, "tgictl.cached_tokens": end.cached_tokens})
    add_finished_span("decode", parent, first_token, end.ended_at, **{
        "gen_ai.usage.output_tokens": end.generated_tokens})


def probe_token(tokenizer: RouterTokenizer, vocab_size: int) -> int:
    """A token id every model has: TGI warms up on "_test"; we take its first id."""
    ids = tokenizer.encode("_test", add_special_tokens=False)
    return ids[0] if ids and ids[0] < vocab_size else 0


class RouterService:
    def __init__(
        self,
        config: RouterConfig,
        model_id: str,
        info: Info,
        limits: RouterLimits,
        tokenizer: RouterTokenizer,
        client: ServiceClient,
        grammars: GrammarValidator | None = None,
    ) -> None:
        self.config = config
        self.model_id = model_id
        # --reasoning-parser: how chat answers split think text from the answer (None: they do not).
        self.reasoning = REASONING_FORMATS[config.reasoning_parser] if config.reasoning_parser else None
        self.info = info
        self.limits = limits
        self.tokenizer = tokenizer
        self._client = client
        self.metrics = RouterMetrics(max_input_tokens=limits.max_input_tokens, max_total_tokens=limits.max_total_tokens)
        self.metrics.batch_max_total_tokens.set(limits.max_batch_total_tokens)
        self.metrics.export_adapters([name for name in info.adapters if name])
        self.validator = Validator(
            tokenizer,
            ValidationLimits(
                max_input_tokens=limits.max_input_tokens,
                max_total_tokens=limits.max_total_tokens,
                max_best_of=config.max_best_of,
                max_stop_sequences=config.max_stop_sequences,
                max_top_n_tokens=config.max_top_n_tokens,
                max_new_tokens_per_round=config.max_new_tokens_per_round,
                vocab_size=info.vocab_size,
                adapters=info.adapters,
                base_model_names=(model_id, *BASE_MODEL_ALIASES),
                priority_scheduling=config.scheduling_policy is SchedulingPolicy.PRIORITY,
            ),
            grammars,
        )
        # The router owns the prefix cache; the shard only says whether it can compute from a cached prefix.
        self.prefix_caching = config.prefix_caching and info.use_prefix_caching
        self.kv_events: KvEventPublisher | None = None
        cache_events = None
        if config.kv_events_endpoint is not None and self.prefix_caching:
            self.kv_events = KvEventPublisher(config.kv_events_endpoint, config.kv_events_replay_endpoint,
                                              config.kv_events_topic)
            cache_events = KvEventLog(info.block_size, self.kv_events.publish)
            cache_events.cleared()  # a (re)started replica holds nothing: consumers drop what they knew of it
        self.allocator = create_allocator(
            limits.num_blocks, info.block_size, self.prefix_caching, cache_events, limits.kv_groups
        )
        self.queue = Queue(self.allocator, block_size=info.block_size, policy=config.scheduling_policy)
        step_client: ShardClient = MeteredClient(client, self.metrics)
        if config.otlp_endpoint is not None:
            step_client = TracedClient(step_client, self._request_trace)
        self.batcher = Batcher(
            step_client,
            self.queue,
            self.allocator,
            TokenTexts(decoder=tokenizer, special_ids=tokenizer.special_ids),
            BatcherConfig(
                max_batch_prefill_tokens=limits.max_batch_prefill_tokens,
                max_batch_size=limits.max_batch_size,
                prefill_group_tokens=prefill_group_tokens(config, info),
                decode_steps=config.decode_steps,
                decode_call_ns=round(config.decode_call_ms * 1e6),
                speculate=info.speculate,
                release_window=release_window(info.layer_windows, limits.kv_groups),
            ),
            on_error=lambda err: self.health.mark_unhealthy(err),
        )
        self.health = HealthChecker(client, probe_token(tokenizer, info.vocab_size), self.batcher.forward_lock)
        # LoRA adapters by slot, as loaded at start-up and later (adapters.py; served only with --allow-lora-loading).
        self.adapters = RuntimeAdapters(
            AdapterSlots(info.adapters), client, self.batcher.forward_lock, (model_id, *BASE_MODEL_ALIASES),
            in_use=lambda: [e.request.adapter_index for e in (*self.queue.entries(), *self.batcher.entries())],
            on_change=self._adapters_changed, forget=self.allocator.forget,
        )
        self._permits = Permits(config.max_concurrent_requests)
        self._channels: set[EventChannel] = set()  # open ones: what a shutdown must end
        allocator = self.allocator
        self.metrics.watch(
            queue_size=lambda: len(self.queue),
            kv_total=lambda: allocator.total_blocks,
            kv_free=lambda: allocator.free_blocks,
            kv_cached=lambda: allocator.cached_blocks,
            preemptions=lambda: self.batcher.scheduler.preemptions,
            waiting_priorities=lambda: (entry.priority for entry in self.queue.entries()),
        )
        register_gateway_gauges(self.metrics.registry, GatewaySources(
            waiting=lambda: len(self.queue),
            running=lambda: self.batcher.in_flight,
            kv_usage=lambda: kv_usage_fraction(allocator.used_blocks, allocator.total_blocks),
            block_size=info.block_size,
            num_blocks=allocator.total_blocks,
            max_lora=lambda: len(self.adapters.slots.loaded),
            running_adapters=lambda: (entry.request.adapter for entry in self.batcher.entries()),
            waiting_adapters=lambda: (entry.request.adapter for entry in self.queue.entries()),
        ))
        self._executor = ThreadPoolExecutor(config.validation_workers, thread_name_prefix="validation")
        self._batcher_task: asyncio.Task[None] | None = None
        self.draining = False
        self._stop_waiting = False  # a second signal: drain ends what still runs at once

    @classmethod
    async def start(cls, config: RouterConfig, model_dir: Path, client: ServiceClient, model_id: str) -> RouterService:
        """Clear, Info, Warmup, derive limits, start the batching task."""
        await client.clear_cache(None)
        info = await client.info()
        if not info.support_chunking:
            # The scheduler always admits prompts as chunks beside the running batch.
            raise UnhealthyError("the shard does not support chunked prefill, which this router requires")
        tokenizer = RouterTokenizer(model_dir)
        prefill_tokens = max_batch_prefill_tokens(config, info)
        request = warmup_request(config, info, probe_token(tokenizer, info.vocab_size), prefill_tokens)
        log.info(
            "warmup: one prefill of %d tokens (--max-batch-prefill-tokens, every sampling option on, as TGI "
            "probes) checks that the largest batch the scheduler will form fits in memory; the KV cache then "
            "takes the memory left. It lasts as long as one %d-token prompt's prefill on this model: seconds "
            "for a small model, minutes for a large one on CPU or with --quantize (docs/operations.md, Warmup)",
            prefill_tokens, prefill_tokens,
        )
        with phase(f"warming up the shards with {prefill_tokens} prefill tokens (sizes the KV cache)", logger=log):
            result = await client.warmup(request)
        limits = derive_limits(config, info, result, prefill_tokens)
        log.info(
            "limits: max_input_tokens=%d max_total_tokens=%d max_batch_prefill_tokens=%d "
            "max_batch_total_tokens=%d (%d blocks of %d)",
            limits.max_input_tokens, limits.max_total_tokens, limits.max_batch_prefill_tokens,
            limits.max_batch_total_tokens, limits.num_blocks, info.block_size,
        )
        if limits.kv_groups is not None:
            log.info(
                "KV layer groups: the global layers keep every position (%d blocks), the sliding-window layers a "
                "window of %d in their own %d blocks; local blocks behind the window go back to the pool as a "
                "request decodes (docs/scheduling.md, Sliding windows)",
                limits.num_blocks, limits.kv_groups.window, limits.kv_groups.local_blocks,
            )
        grammars = GrammarValidator.for_model(model_dir, info.vocab_size, info.eos_token_ids)
        service = cls(config, model_id, info, limits, tokenizer, client, grammars)
        service._batcher_task = asyncio.create_task(service.batcher.run(), name="batcher")
        return service

    def _adapters_changed(self, slots: AdapterSlots) -> None:
        self.validator.limits = dataclasses.replace(self.validator.limits, adapters=slots.names)
        self.metrics.export_adapters(slots.loaded)

    @property
    def in_flight(self) -> int:
        return self._permits.in_use

    def _request_trace(self, request_id: int) -> object | None:
        entry = self.batcher.entry(request_id)
        return entry.request.trace if entry is not None else None

    def admit(self) -> Admission:
        """A concurrency permit for one generation: 503 while draining, 429 when none is left."""
        self.metrics.request_count.inc()
        if self.draining:
            raise ShuttingDownError()
        if self._permits.in_use >= self._permits.limit:
            self.metrics.request_failure.labels(err="overloaded").inc()
            raise OverloadedError()
        self._permits.in_use += 1
        return Admission(permits=self._permits)

    async def validate(self, admission: Admission, request: GenerationInput) -> ValidatedRequest:
        """Tokenize and check limits in the worker pool, off the event loop."""
        start = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            with tracer().start_as_current_span("validation"):
                validated = await loop.run_in_executor(self._executor, self.validator.validate, request)
        except ValidationError:
            self.metrics.request_failure.labels(err="validation").inc()
            raise
        elapsed = time.monotonic() - start
        admission.validation_s += elapsed
        self.metrics.validation_duration.observe(elapsed)
        self.metrics.input_length.observe(validated.input_length)
        self.metrics.max_new_tokens.observe(validated.total_new_tokens)
        return validated

    async def render_chat(
        self, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]] | None,
        template_kwargs: Mapping[str, object] | None = None,
    ) -> str:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._executor, self.tokenizer.apply_chat_template, messages, tools, template_kwargs)
        except TemplateError:
            self.metrics.request_failure.labels(err="template").inc()
            raise

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[tuple[int, int, int]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.tokenizer.encode_with_offsets, text, add_special_tokens)

    def open(self, admissions: Sequence[Admission], requests: Sequence[ValidatedRequest]) -> EventChannel:
        """Queue the generations; their events arrive in the returned channel, which the caller
        closes when it stops reading (closing early cancels what still runs)."""
        stale = [r.adapter for r in requests if not self.adapters.slots.holds(r.adapter_index, r.adapter)]
        if stale:  # its adapter was unloaded while it was validated: it ends at once, in its API's way
            self.metrics.request_failure.labels(err="validation").inc()
            failed = EventChannel(len(requests))
            failed.fail(ValidationError(f"the LoRA adapter `{stale[0]}` was unloaded"))
            return failed
        traced: otel_context.Context | None = otel_context.get_current()
        span = trace.get_current_span(traced)
        if span.is_recording():  # inside the request span (http/request_spans.py): batch spans link to it
            requests = [dataclasses.replace(r, trace=span.get_span_context()) for r in requests]
        else:
            traced = None
        channel = self.batcher.submit(requests, self.config.max_new_tokens_per_round)
        self._channels.add(channel)
        adapters = [r.adapter for r in requests]
        for request in requests:
            self.metrics.observe_queued(request.adapter, request.input_length)
        origin = RequestOrigin.current() if self.config.request_log else None
        channel.on_close(lambda c: self._closed(c, admissions, adapters, traced, origin))
        return channel

    def _closed(
        self, channel: EventChannel, admissions: Sequence[Admission], adapters: Sequence[str | None],
        trace_parent: otel_context.Context | None, origin: RequestOrigin | None,
    ) -> None:
        """Every request's outcome is counted once, when its channel closes; a traced request gets
        its queue, prefill and decode spans from the scheduler's timings; each gets its log line."""
        self._channels.discard(channel)
        now = time.monotonic()
        for index, admission in enumerate(admissions):
            event = channel.ends.get(index)
            if isinstance(event, EndEvent):
                self.metrics.observe_end(now - admission.start, event, adapters[index])
                if trace_parent is not None:
                    phase_spans(trace_parent, event)
            else:
                self.metrics.request_failure.labels(err="generation" if event is not None else "dropped").inc()
            if origin is not None:
                log_finished(origin, index, len(admissions), adapters[index], now - admission.start,
                             admission.validation_s, event)

    async def stream(self, admission: Admission, request: ValidatedRequest) -> AsyncIterator[StreamEvent]:
        """One generation's events, for callers that need no keep-alive; closing the iterator
        cancels it."""
        async for event in events(self.open([admission], [request])):
            yield event

    async def check_health(self) -> None:
        if self.draining:
            raise ShuttingDownError()
        await self.health.check()

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Stop admitting; wait for in-flight requests up to the timeout, then end the rest.
        Returns whether everything finished in time."""
        self.draining = True
        timeout = self.config.graceful_termination_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while self.in_flight > 0 and time.monotonic() < deadline and not self._stop_waiting:
            await asyncio.sleep(0.05)
        finished = self.in_flight == 0
        if not finished:
            why = "stopped without waiting (a second signal)" if self._stop_waiting else "graceful termination timeout"
            log.warning("%s: ending %d requests with an error event", why, self.in_flight)
            for channel in list(self._channels):
                channel.fail(ShuttingDownError("the server shut down before the request ended"))
            # Give the streams a moment to deliver their error event and release their permits.
            end = time.monotonic() + 2.0
            while self.in_flight > 0 and time.monotonic() < end:
                await asyncio.sleep(0.02)
        return finished

    def stop_waiting(self) -> None:
        """End a drain now: what still runs gets its error event without waiting for the timeout."""
        self._stop_waiting = True

    async def close(self) -> None:
        """After drain: stop the batching task and release the shard connection and workers."""
        self.draining = True
        if self._batcher_task is not None:
            self._batcher_task.cancel()
            try:
                await self._batcher_task
            except asyncio.CancelledError:
                pass
            self._batcher_task = None
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self.kv_events is not None:
            self.kv_events.close()
        await self._client.close()
