"""The gRPC TextGenerationService of one rank (generate.proto; TGI's server.py TextGenerationService).

Threading: every RPC that touches the device or the batch store runs on ONE worker thread, in the
order the RPCs arrive. One forward at a time is what the KV cache and the batch store need (no
locks), and with tensor parallelism every rank then runs its collectives in the order the router
sent the RPCs. The event loop never blocks on torch, so Info, ServiceDiscovery, signals and gRPC I/O
stay responsive during a long prefill. Each job does its whole read-compute-store update on the
worker: a client that gives up mid-step (deadline, cancel) cannot leave a half-updated store behind.
Measured on the tiny llama (2 busy CPU cores, 300 Decode RPCs from another process, 25th percentile):
the thread hop is within the noise of running torch inline on the event loop (batch 1: ~1.8-2.0 ms
per RPC either way; batch 32: ~3.2-3.6 ms).

Errors are mapped in exactly one place, `grpc_status`, which `_rpc` applies to every RPC: a
TgictlError answers with its own gRPC status (INVALID_ARGUMENT, NOT_FOUND...) and the shard keeps
serving; INTERNAL (a DeviceError, or any other exception: CUDA out of memory, a failed collective, a
RuntimeError from torch, a bug) means the shard's state can no longer be trusted, so `on_fatal` is
called and the process exits non-zero (as in TGI: the launcher then tears every process down).
A device job reports its own fatal failure too, so it stops the shard even if its client gave up.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

import grpc
import grpc.aio
import torch

from tgictl.config import DEFAULT_HEALTH_STEP_TIMEOUT_S
from tgictl.errors import InvalidRequestError, TgictlError, UnhealthyError, bounded
from tgictl.proto import convert
from tgictl.proto import generate_pb2 as pb
from tgictl.proto.generate_pb2_grpc import TextGenerationServiceServicer
from tgictl.proto.messages import BlockGrant, CachedBatch, StepResult, WarmupResult
from tgictl.runtime.shard.batch import ShardBatch, apply_grants
from tgictl.runtime.shard.batch_store import BatchStore
from tgictl.runtime.shard.decode_steps import check_steps, merge_steps
from tgictl.runtime.shard.faults import StepFaults
from tgictl.runtime.shard.host_memory import release_free_memory
from tgictl.runtime.shard.lookahead import StepAhead, merge_outputs
from tgictl.runtime.shard.runtime import ShardRuntime, StepOutput
from tgictl.tracing import server_span

log = logging.getLogger("tgictl.shard")

T = TypeVar("T")
Handler = Callable[[Any, Any], Awaitable[Any]]


class DeviceWorker:
    """A single thread that runs device jobs in submission order.

    The shard's every torch computation belongs on this thread, model loading included (`call`): libgomp
    keeps one pool of OpenMP workers per thread that starts a parallel region, and once a process manages
    more OpenMP threads than it has CPUs, libgomp stops spinning between regions (100 spins instead of
    ~3 ms) and puts its workers to sleep after every region. A decode step is hundreds of regions, so a
    second pool (the main thread's, left over from loading) doubled the batch-1 step: 18.9 against 8.9 ms
    on 2 cores (AMD EPYC), the same step run in another thread than the one that loaded the model.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tgictl-device")
        self._pending: dict[Future[Any], str] = {}  # job → its name
        self._abandoned: set[Future[Any]] = set()  # jobs nobody waits for: their RPC's client gave up, or posted
        self._closed = False
        # The job on the device thread now and when it started (one tuple, swapped whole: read from the event
        # loop's thread without a lock); None while the thread waits for work.
        self._running: tuple[str, float] | None = None

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the device thread and wait for it (before the event loop serves: loading)."""
        return self._pool.submit(self._timed, getattr(fn, "__name__", "job"), fn, *args).result()

    def post(self, fn: Callable[..., Any], *args: Any, name: str = "") -> None:
        """Queue `fn(*args)` after the jobs already queued, with nobody waiting for it (a device job posts the
        look-ahead step this way, so it runs before any later RPC's job). `fn` reports its own failures."""
        name = name or getattr(fn, "__name__", "job")
        future = self._pool.submit(self._timed, name, fn, *args)
        self._pending[future] = name
        self._abandoned.add(future)
        future.add_done_callback(self._forget)

    async def run(self, fn: Callable[..., T], *args: Any, name: str = "") -> T:
        name = name or getattr(fn, "__name__", "job")
        future = self._pool.submit(self._timed, name, fn, *args)
        self._pending[future] = name
        future.add_done_callback(self._forget)
        result = asyncio.wrap_future(future)
        # Retrieved even when nobody awaits it any more (the job's own error handling reported it).
        result.add_done_callback(lambda f: f.cancelled() or f.exception())
        # Shielded: a client that gives up must not cancel a job still queued, or this rank would skip
        # a step the other ranks run (their collectives would then wait for it).
        try:
            return await asyncio.shield(result)
        except asyncio.CancelledError:
            self._abandoned.add(future)
            raise

    def _timed(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        self._running = (name, time.monotonic())
        try:
            return fn(*args)
        finally:
            self._running = None

    def running(self) -> tuple[str, float] | None:
        """The job the device thread runs now and for how many seconds; None while it waits for work."""
        running = self._running
        return None if running is None else (running[0], time.monotonic() - running[1])

    def _forget(self, future: Future[Any]) -> None:
        self._pending.pop(future, None)
        self._abandoned.discard(future)

    def abandoned(self) -> list[str]:
        """Names of the jobs still running that nobody waits for any more; empty when some job still
        has a waiting client."""
        pending = list(self._pending)
        if pending and all(f in self._abandoned for f in pending):
            return [self._pending[f] for f in pending]
        return []

    def drain(self, timeout_s: float) -> bool:
        """Wait for the jobs already submitted; False when one is still running after `timeout_s`."""
        _, not_done = wait(list(self._pending), timeout=timeout_s)
        return not not_done

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)


def grpc_status(err: Exception) -> tuple[grpc.StatusCode, str]:
    """The one error mapping of the shard. INTERNAL means fatal: the process stops."""
    if isinstance(err, TgictlError):
        return grpc.StatusCode[err.grpc_status], bounded(err.message)
    # Anything else (CUDA out of memory, a failed collective, a RuntimeError from torch, a bug) leaves
    # the device state unknown.
    return grpc.StatusCode.INTERNAL, bounded(f"{type(err).__name__}: {err}")


def _rpc(handler: Handler) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """Answers every failure of `handler` with `grpc_status`; a fatal one also stops the shard."""

    @functools.wraps(handler)
    async def wrapper(self: ShardServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        name = handler.__name__
        if self.failed is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"shard is stopping after an error: {self.failed}")
        log.debug("%s started", name)
        try:
            # A child of the router's batch span when the RPC carries its trace context.
            with server_span(name, context.invocation_metadata() or ()):
                return await handler(self, request)
        except Exception as err:  # noqa: BLE001 - every failure gets a status; none escapes unmapped
            code, message = grpc_status(err)
            if code is grpc.StatusCode.INTERNAL:
                # A device job already logged its traceback; repeat it only when debugging.
                log.error("%s failed: %s", name, message, exc_info=log.isEnabledFor(logging.DEBUG))
                self.fail(message)
            else:
                log.warning("%s refused: %s", name, message)
        await context.abort(code, message)

    return wrapper


# Once the shard has held no batch for this long, its freed heap memory goes back to the OS (host_memory.py).
# Not at once: a trim hands back pages that the next long prompt then faults in again (one 1,000-token
# prompt after another, bf16 SmolLM2 on 2 cores: time to first token 363 -> 440 ms with a trim after each).
IDLE_TRIM_DELAY_S = 2.0


class ShardServicer(TextGenerationServiceServicer):
    """Serves one rank. `on_fatal(message)` is called once, on the first unrecoverable error."""

    def __init__(
        self,
        runtime: ShardRuntime,
        urls: Sequence[str],
        *,
        worker: DeviceWorker,
        on_fatal: Callable[[str], None],
        faults: StepFaults | None = None,
        lookahead: bool = True,
        idle_trim_delay_s: float = IDLE_TRIM_DELAY_S,
        health_step_timeout_s: float = DEFAULT_HEALTH_STEP_TIMEOUT_S,
    ) -> None:
        self.runtime = runtime
        self.store = BatchStore()
        self.ahead = StepAhead(runtime, self.store, enabled=lookahead)
        self.worker = worker
        self.failed: str | None = None
        self._on_fatal = on_fatal
        self._faults = faults if faults is not None else StepFaults(None)  # test-only, inert unless set
        self._urls = convert.service_discovery_response_to_pb(list(urls))
        self._loop: asyncio.AbstractEventLoop | None = None  # the RPCs' loop, for failures of posted jobs
        self._idle_trim_delay_s = idle_trim_delay_s
        self._health_step_timeout_s = health_step_timeout_s
        self._last_step_end = time.monotonic()  # written on the device thread after every step

    def fail(self, message: str) -> None:
        """Stop serving after an unrecoverable error (called on the event loop, once per error)."""
        if self.failed is None:
            log.error("stopping the shard after an unrecoverable error: %s", message)
            self.failed = message
            self._on_fatal(message)

    async def _on_device(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the device thread. A fatal failure stops the shard from there, so it
        counts even when the RPC's client has already given up."""
        loop = self._loop = asyncio.get_running_loop()

        def job() -> T:
            try:
                return fn(*args)
            except Exception as err:
                self._report_fatal(loop, fn.__name__, err)
                raise

        return await self.worker.run(job, name=fn.__name__.lstrip("_"))

    def _report_fatal(self, loop: asyncio.AbstractEventLoop, name: str, err: Exception) -> None:
        """On the device thread: an unrecoverable failure stops the shard (from the event loop)."""
        code, message = grpc_status(err)
        if code is grpc.StatusCode.INTERNAL:
            log.error("device job %s failed: %s", name, message, exc_info=True)
            loop.call_soon_threadsafe(self.fail, message)

    # --- RPCs ------------------------------------------------------------------------------------

    @_rpc
    async def Info(self, request: pb.InfoRequest) -> pb.InfoResponse:
        return convert.info_to_pb(self.runtime.info())  # its adapters change with LoadAdapter / UnloadAdapter

    @_rpc
    async def ServiceDiscovery(self, request: pb.ServiceDiscoveryRequest) -> pb.ServiceDiscoveryResponse:
        return self._urls

    @_rpc
    async def Health(self, request: pb.HealthRequest) -> pb.HealthResponse:
        """Liveness from the shard's state, answered on the event loop: it never waits behind a step (a busy
        shard is a healthy one). Unhealthy once a fatal error stopped it (`_rpc` answers UNAVAILABLE) or one
        device job has run longer than --health-step-timeout (a hung device or collective)."""
        running = self.worker.running()
        if running is not None and running[1] > self._health_step_timeout_s:
            name, seconds = running
            raise UnhealthyError(
                f"the device thread has run one job ({name}) for {seconds:.0f} s, more than --health-step-timeout "
                f"{self._health_step_timeout_s:g} s"
            )
        return pb.HealthResponse()

    @_rpc
    async def ClearCache(self, request: pb.ClearCacheRequest) -> pb.ClearCacheResponse:
        await self._on_device(self._clear_cache, convert.clear_cache_request_from_pb(request).batch_id)
        return pb.ClearCacheResponse()

    @_rpc
    async def FilterBatch(self, request: pb.FilterBatchRequest) -> pb.FilterBatchResponse:
        message = convert.filter_batch_request_from_pb(request)
        cached = await self._on_device(self._filter, message.batch_id, message.request_ids)
        return convert.filter_batch_response_to_pb(cached)

    @_rpc
    async def Warmup(self, request: pb.WarmupRequest) -> pb.WarmupResponse:
        result = await self._on_device(self._warmup, request)
        return convert.warmup_response_to_pb(result)

    @_rpc
    async def Prefill(self, request: pb.PrefillRequest) -> pb.PrefillResponse:
        start = time.perf_counter_ns()
        result = await self._on_device(self._prefill, request)
        self._arm_idle_trim()
        response = convert.prefill_response_to_pb(result)
        response.total_ns = time.perf_counter_ns() - start  # the whole RPC, conversions included
        return response

    @_rpc
    async def Decode(self, request: pb.DecodeRequest) -> pb.DecodeResponse:
        start = time.perf_counter_ns()
        result = await self._on_device(self._decode, request)
        self._arm_idle_trim()
        response = convert.decode_response_to_pb(result)
        response.total_ns = time.perf_counter_ns() - start
        return response

    @_rpc
    async def LoadAdapter(self, request: pb.LoadAdapterRequest) -> pb.LoadAdapterResponse:
        message = convert.load_adapter_request_from_pb(request)
        # On the device thread, between steps: no forward reads the stacks while they change.
        await self._on_device(self.runtime.load_adapter, message.name, message.path, message.adapter_index)
        return pb.LoadAdapterResponse()

    @_rpc
    async def UnloadAdapter(self, request: pb.UnloadAdapterRequest) -> pb.UnloadAdapterResponse:
        await self._on_device(self.runtime.unload_adapter, convert.unload_adapter_request_from_pb(request))
        return pb.UnloadAdapterResponse()

    def _arm_idle_trim(self) -> None:
        """After a step that left no batch: a heap trim once the shard has stayed idle (IDLE_TRIM_DELAY_S)."""
        if not self.store and self._loop is not None:
            self._loop.call_later(self._idle_trim_delay_s, self._post_idle_trim)

    def _post_idle_trim(self) -> None:
        if not self.store and self.failed is None and not self.worker.closed:
            self.worker.post(self._trim_if_idle, name="heap trim")

    # --- jobs on the device worker ---------------------------------------------------------------

    def _clear_cache(self, batch_id: int | None) -> None:
        dropped = self.ahead.drop(batch_id)  # its batch may have finished in the kept step
        if batch_id is None:
            self.store.clear()
        elif not dropped or batch_id in self.store:
            self.store.remove(batch_id)
        if self.runtime.device.type == "cuda":
            torch.cuda.empty_cache()

    def _filter(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch:
        ahead = self.ahead.filter(batch_id, request_ids)
        if ahead is not None:
            return ahead
        kept = self.store.get(batch_id).filter(request_ids)  # validates before it changes anything
        self.store.replace([batch_id], kept)
        return kept.to_cached()

    def _warmup(self, request: pb.WarmupRequest) -> WarmupResult:
        message = convert.warmup_request_from_pb(request)
        # Warmup re-allocates the KV cache, so no cached batch survives it (the router clears first).
        self.ahead.drop(None)
        self.store.clear()
        return self.runtime.warmup(message)

    def _prefill(self, request: pb.PrefillRequest) -> StepResult:
        message = convert.prefill_request_from_pb(request)
        self._faults.before_step("Prefill")
        if message.max_prefill_tokens is not None:
            self.runtime.set_max_prefill_tokens(message.max_prefill_tokens)
        batch_id = message.batch.id
        consumed: list[int] = []
        cached: ShardBatch | None = None
        ahead_id: int | None = None  # the cached batch, when its step already ran ahead
        if message.cached_batch is not None:
            consumed.append(message.cached_batch.id)
            self._grant(consumed, message.grants)
            if self.ahead.holds(message.cached_batch.id):
                ahead_id = message.cached_batch.id
            else:
                cached = self.store.get(message.cached_batch.id)
        elif message.grants:
            raise InvalidRequestError("grants need a cached batch: they are for its requests")
        if batch_id in self.store and batch_id not in consumed:
            raise InvalidRequestError(f"batch {batch_id}: a cached batch already has this id")
        # The runtime validates the new batch before it touches `cached`, so a refusal changes nothing.
        output = self.runtime.prefill(message.batch, cached)
        if ahead_id is not None:  # the cached rows' step first, as a mixed forward would list them
            kept = self.ahead.take(ahead_id)
            assert kept is not None
            output = merge_outputs(kept, output, batch_id)
        if output[1] is not None:
            output[1].id = batch_id  # concatenated under the cached batch's id; the proto caches it here
        return self._store_step(consumed, output)

    def _decode(self, request: pb.DecodeRequest) -> StepResult:
        message = convert.decode_request_from_pb(request)
        steps = check_steps(message.steps)
        ids = [b.id for b in message.batches]
        self._grant(ids, message.grants)
        output = self.ahead.decode(ids, self._step)
        if output is None:
            output = self._step(ids)
        for _ in range(steps - 1):  # decode_steps.py: the next steps of the same batch, answered as one
            if output[1] is None or not output[1].fits_next_step():  # a row needs blocks: the router's next call
                break
            self.store.replace(ids, output[1])
            ids = [output[1].id]
            output = merge_steps(output, self._step(ids))
        return self._store_step(ids, output)

    def _grant(self, batch_ids: Sequence[int], grants: Sequence[BlockGrant]) -> None:
        """The call's BlockGrants onto the rows of its stored batches (after a kept look-ahead step, the rows
        it left; a grant for a request that step finished is ignored)."""
        if not grants:
            return
        batches = [self.store.get(i) for i in batch_ids if i in self.store or not self.ahead.holds(i)]
        ended = frozenset().union(*(self.ahead.ended(i) for i in batch_ids))
        cache = self.runtime.runner.kv_cache
        apply_grants(batches, grants, cache.num_blocks, ended, cache.groups)

    def _step(self, ids: Sequence[int]) -> StepOutput:
        self._faults.before_step("Decode")
        batches = self.store.get_many(ids)  # all or nothing: an unknown id consumes no batch
        return self.runtime.decode(batches)

    def _store_step(self, consumed: Sequence[int], output: StepOutput) -> StepResult:
        generations, next_batch, timings = output
        self.store.replace(consumed, next_batch)
        self._last_step_end = time.monotonic()
        cached = next_batch.to_cached() if next_batch is not None else None
        if self.ahead.eligible(next_batch) and self._loop is not None:
            assert next_batch is not None
            self.worker.post(self._look_ahead, self._loop, next_batch.id, name="look-ahead step")
        return StepResult(generations=tuple(generations), batch=cached, timings=timings)

    def _trim_if_idle(self) -> None:
        """The posted job: checked here, in order with the steps, as a step may have come since."""
        if not self.store and time.monotonic() - self._last_step_end >= self._idle_trim_delay_s:
            release_free_memory()

    def _look_ahead(self, loop: asyncio.AbstractEventLoop, batch_id: int) -> None:
        """The posted job: the stored batch's next step (lookahead.py); a recoverable failure waits for the
        RPC that asks for the step, an unrecoverable one stops the shard now."""
        try:
            self.ahead.run(batch_id, self._faults.before_step)
        except Exception as err:  # noqa: BLE001 - kept for the taker; only fatal ones are reported here
            self._report_fatal(loop, "look-ahead step", err)
