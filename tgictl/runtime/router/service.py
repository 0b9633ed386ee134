"""The running router: start-up against the shards, the pieces every route uses, graceful shutdown.

Start-up follows TGI (reference 1.3): connect, ClearCache(None), Info, Warmup, then the limits
derived from the warmup (router/limits.py), the allocator sized from them, the queue, the batching
task and Infer. Shutdown: stop admitting (503), let in-flight requests finish up to the graceful
timeout, then end the rest with an error event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tgictl.config import RouterConfig
from tgictl.errors import TemplateError, TgictlError, UnhealthyError, ValidationError
from tgictl.proto.messages import Info, WarmupRequest, WarmupResult
from tgictl.runtime.router.allocator_factory import create_allocator
from tgictl.runtime.router.batcher import Batcher, BatcherConfig, ShardClient
from tgictl.runtime.router.health import HealthChecker
from tgictl.runtime.router.infer import Infer, InferConfig
from tgictl.runtime.router.limits import RouterLimits, derive_limits, max_batch_prefill_tokens, warmup_request
from tgictl.runtime.router.metered_client import MeteredClient
from tgictl.runtime.router.metrics import RouterMetrics
from tgictl.runtime.router.queue import Queue
from tgictl.runtime.router.request import EndEvent, ErrorEvent, StreamEvent, ValidatedRequest
from tgictl.runtime.router.request_state import TokenTexts
from tgictl.runtime.router.tokenizer import RouterTokenizer
from tgictl.runtime.router.validation import GenerationInput, ValidationLimits, Validator

log = logging.getLogger(__name__)


class ServiceClient(ShardClient, Protocol):
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
class Admission:
    """One admitted request: its concurrency permit and timings. `release()` is idempotent."""

    permit: ExitStack
    start: float = field(default_factory=time.monotonic)
    validation_s: float = 0.0

    def release(self) -> None:
        self.permit.close()


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
    ) -> None:
        self.config = config
        self.model_id = model_id
        self.info = info
        self.limits = limits
        self.tokenizer = tokenizer
        self._client = client
        self.metrics = RouterMetrics(max_input_tokens=limits.max_input_tokens, max_total_tokens=limits.max_total_tokens)
        self.metrics.batch_max_total_tokens.set(limits.max_batch_total_tokens)
        self.validator = Validator(
            tokenizer,
            ValidationLimits(
                max_input_tokens=limits.max_input_tokens,
                max_total_tokens=limits.max_total_tokens,
                max_best_of=config.max_best_of,
                max_stop_sequences=config.max_stop_sequences,
                max_top_n_tokens=config.max_top_n_tokens,
                max_new_tokens_per_round=config.max_new_tokens_per_round,
            ),
        )
        self.allocator = create_allocator(limits.num_blocks, info.block_size, info.use_prefix_caching)
        self.queue = Queue(self.allocator, block_size=info.block_size, support_chunking=info.support_chunking)
        self.health = HealthChecker(client, probe_token(tokenizer, info.vocab_size))
        self.batcher = Batcher(
            MeteredClient(client, self.metrics),
            self.queue,
            self.allocator,
            TokenTexts(decoder=tokenizer, special_ids=tokenizer.special_ids),
            BatcherConfig(
                max_batch_prefill_tokens=limits.max_batch_prefill_tokens,
                max_batch_total_tokens=limits.max_batch_total_tokens,
                max_batch_size=limits.max_batch_size,
                waiting_served_ratio=config.waiting_served_ratio,
                max_waiting_tokens=config.max_waiting_tokens,
                support_chunking=info.support_chunking,
            ),
            on_error=self.health.mark_unhealthy,
        )
        self.infer = Infer(
            self.batcher,
            InferConfig(
                max_concurrent_requests=config.max_concurrent_requests,
                max_new_tokens_per_round=config.max_new_tokens_per_round,
                max_total_tokens=limits.max_total_tokens,
            ),
        )
        allocator = self.allocator
        self.metrics.watch(
            queue_size=lambda: len(self.queue),
            kv_total=lambda: allocator.total_blocks,
            kv_free=lambda: allocator.free_blocks,
            kv_cached=lambda: allocator.cached_blocks,
        )
        self._executor = ThreadPoolExecutor(config.validation_workers, thread_name_prefix="validation")
        self._batcher_task: asyncio.Task[None] | None = None
        self._abort = asyncio.Event()
        self.draining = False

    @classmethod
    async def start(cls, config: RouterConfig, model_dir: Path, client: ServiceClient, model_id: str) -> RouterService:
        """Clear, Info, Warmup, derive limits, start the batching task."""
        await client.clear_cache(None)
        info = await client.info()
        tokenizer = RouterTokenizer(model_dir)
        prefill_tokens = max_batch_prefill_tokens(config, info)
        request = warmup_request(config, info, probe_token(tokenizer, info.vocab_size), prefill_tokens)
        log.info("warming up the shards with %d prefill tokens", prefill_tokens)
        result = await client.warmup(request)
        limits = derive_limits(config, info, result, prefill_tokens)
        log.info(
            "limits: max_input_tokens=%d max_total_tokens=%d max_batch_prefill_tokens=%d "
            "max_batch_total_tokens=%d (%d blocks of %d)",
            limits.max_input_tokens, limits.max_total_tokens, limits.max_batch_prefill_tokens,
            limits.max_batch_total_tokens, limits.num_blocks, info.block_size,
        )
        service = cls(config, model_id, info, limits, tokenizer, client)
        service._batcher_task = asyncio.create_task(service.batcher.run(), name="batcher")
        return service

    @property
    def in_flight(self) -> int:
        return self.infer.permits_in_use

    def admit(self) -> Admission:
        """A concurrency permit for one request: 503 while draining, 429 when none is left."""
        self.metrics.request_count.inc()
        if self.draining:
            raise ShuttingDownError()
        stack = ExitStack()
        try:
            stack.enter_context(self.infer.permit())
        except TgictlError:
            self.metrics.request_failure.labels(err="overloaded").inc()
            raise
        return Admission(permit=stack)

    async def validate(self, admission: Admission, request: GenerationInput) -> ValidatedRequest:
        """Tokenize and check limits in the worker pool, off the event loop."""
        start = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
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

    async def render_chat(self, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]] | None) -> str:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self.tokenizer.apply_chat_template, messages, tools)
        except TemplateError:
            self.metrics.request_failure.labels(err="template").inc()
            raise

    async def tokenize(self, text: str) -> list[tuple[int, int, int]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.tokenizer.encode_with_offsets, text)

    async def stream(self, admission: Admission, request: ValidatedRequest) -> AsyncIterator[StreamEvent]:
        """The request's events; closing the iterator cancels it. Ends with an error event when the
        graceful shutdown timeout runs out first."""
        inner = self.infer.stream(request)
        abort = asyncio.ensure_future(self._abort.wait())
        step: asyncio.Future[StreamEvent] | None = None
        ended = False
        try:
            while True:
                step = asyncio.ensure_future(anext(inner))
                done, _ = await asyncio.wait({step, abort}, return_when=asyncio.FIRST_COMPLETED)
                if step not in done:
                    step.cancel()
                    ended = True
                    self.metrics.request_failure.labels(err="generation").inc()
                    yield ErrorEvent(ShuttingDownError("the server shut down before the request ended"))
                    return
                try:
                    event = step.result()
                except StopAsyncIteration:
                    ended = True
                    self.metrics.request_failure.labels(err="incomplete").inc()
                    return
                if isinstance(event, EndEvent):
                    ended = True
                    self.metrics.observe_end(time.monotonic() - admission.start, event)
                elif isinstance(event, ErrorEvent):
                    ended = True
                    self.metrics.request_failure.labels(err="generation").inc()
                yield event
                if ended:
                    return
        finally:
            # Synchronous bookkeeping first: under a cancelled anyio scope (Starlette noticed the
            # disconnect) every await here raises CancelledError again at once.
            abort.cancel()
            if not ended:
                self.metrics.request_failure.labels(err="dropped").inc()
            if step is not None and not step.done():
                # The pending step runs the inner generator; cancelling it ends that generator,
                # whose own cleanup cancels the request (Infer closes the round).
                step.cancel()
            else:
                await inner.aclose()

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
        while self.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        finished = self.in_flight == 0
        if not finished:
            log.warning("graceful termination timeout: ending %d requests", self.in_flight)
            self._abort.set()
            # Give the streams a moment to deliver their error event and release their permits.
            end = time.monotonic() + 2.0
            while self.in_flight > 0 and time.monotonic() < end:
                await asyncio.sleep(0.02)
        return finished

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
        await self._client.close()
