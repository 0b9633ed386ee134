"""The continuous-batching task: one asyncio task runs every step of every in-flight request
(docs/architecture.md, "Scheduling").

Each step is one forward on the shards, as the scheduler (scheduler.py) plans it: requests it preempted
leave the shard's batch first (FilterBatch); then a Prefill when waiting requests were admitted (it
carries the running batch, which the shard concatenates into one mixed forward of prompt chunks and
decode rows), else a Decode; either carries the blocks the running requests were granted. Finished,
stopped and disconnected requests leave the batch before the next step; their blocks go back to the
allocator, with only computed tokens published. A request whose round ended with tokens still owed,
or that was preempted, is queued again (see entry.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tgictl.config import MAX_ADAPTIVE_DECODE_STEPS
from tgictl.errors import GenerationError, TgictlError
from tgictl.proto.messages import Batch, BlockGrant, CachedBatch, StepResult
from tgictl.runtime.router.kv.block_allocator import KvAllocator
from tgictl.runtime.router.request import ValidatedRequest
from tgictl.runtime.router.scheduling.entry import Entry, TokenTexts
from tgictl.runtime.router.scheduling.event_channel import EventChannel
from tgictl.runtime.router.scheduling.queue import NextBatch, Queue
from tgictl.runtime.router.scheduling.scheduler import Scheduler, SchedulerConfig, StepPlan

log = logging.getLogger(__name__)


class ShardClient(Protocol):
    """The calls the batcher makes; ShardedClient implements them over gRPC."""

    async def prefill(
        self, batch: Batch, cached: CachedBatch | None, max_prefill_tokens: int | None = None,
        grants: Sequence[BlockGrant] = (),
    ) -> StepResult: ...

    async def decode(
        self, batches: Sequence[CachedBatch], steps: int = 1, grants: Sequence[BlockGrant] = ()
    ) -> StepResult: ...

    async def filter_batch(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch: ...

    async def clear_cache(self, batch_id: int | None) -> None: ...


@dataclass(frozen=True)
class BatcherConfig:
    max_batch_prefill_tokens: int
    max_batch_size: int | None = None
    prefill_group_tokens: int | None = None  # SchedulerConfig.prefill_group_tokens
    decode_steps: int = 1  # per Decode while the queue is empty (RouterConfig.decode_steps)
    decode_call_ns: int = 0  # more steps while they are short, to about this forward per call (RouterConfig)
    speculate: int = 0  # the shard's draft tokens per step (Info.speculate): blocks are granted ahead for them
    release_window: int | None = None  # every layer's narrowest sliding window, when all have one (scheduler.py)


class Batcher:
    def __init__(
        self,
        client: ShardClient,
        queue: Queue,
        allocator: KvAllocator,
        texts: TokenTexts,
        config: BatcherConfig,
        on_error: Callable[[TgictlError], None] = lambda err: None,
    ) -> None:
        self._client = client
        self._config = config
        self._on_error = on_error
        self.scheduler = Scheduler(queue, allocator, texts, SchedulerConfig(
            max_batch_prefill_tokens=config.max_batch_prefill_tokens, max_batch_size=config.max_batch_size,
            prefill_group_tokens=config.prefill_group_tokens, speculate=config.speculate,
            release_window=config.release_window,
        ))
        self._step_ns: float | None = None  # forward per step of the last Decode whose steps all ran
        self._wakeup = asyncio.Event()
        # Held around every forward; /health's probe forward takes it too (health.py), so the shards
        # always see one forward at a time, in the same order on every rank.
        self.forward_lock = asyncio.Lock()

    @property
    def in_flight(self) -> int:
        return len(self.scheduler.running)

    def entries(self) -> list[Entry]:
        """The in-flight entries (a copy: the batching task changes the set)."""
        return list(self.scheduler.running.values())

    def entry(self, request_id: int) -> Entry | None:
        """The in-flight entry of a shard request id (tracing links a batch to its requests)."""
        return self.scheduler.running.get(request_id)

    def enqueue(self, entry: Entry) -> int:
        request_id = self.scheduler.add(entry)
        self._wakeup.set()
        return request_id

    def submit(self, requests: Sequence[ValidatedRequest], max_new_tokens_per_round: int | None = None) -> EventChannel:
        """Queue one Entry per request; their events arrive in the returned channel."""
        channel = EventChannel(len(requests), on_cancel=self.notify)
        for sink, request in zip(channel.sinks, requests):
            self.enqueue(Entry(request, sink.send, sink.is_cancelled, max_new_tokens_per_round=max_new_tokens_per_round))
        return channel

    def notify(self) -> None:
        """Something changed outside (a client left): let an idle loop look at the queue."""
        self._wakeup.set()

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                await self._serve_until_idle()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a bug must not leave clients hanging: fail what is in flight
                running = list(self.scheduler.running)
                log.exception("batching loop failed; failing %d in-flight requests", len(running))
                await self._fail([], running, GenerationError(f"Server error: {err}"))
                await self._clear_all()

    async def _clear_all(self) -> None:
        try:
            await self._client.clear_cache(None)
        except TgictlError as err:
            log.error("clear_cache(all) failed: %s", err)

    async def _serve_until_idle(self) -> None:
        running: CachedBatch | None = None
        while True:
            plan = self.scheduler.schedule(running, self.decode_steps())
            if plan is None:
                return
            if plan.preempted and running is not None:
                running = await self._keep(running, [rid for rid in running.request_ids if rid not in plan.preempted])
            if plan.prefill is not None:
                running = await self._prefill(plan.prefill, running, plan.grants)
            elif running is not None:
                running = await self._decode(running, plan)

    async def _prefill(self, nb: NextBatch, cached: CachedBatch | None, grants: Sequence[BlockGrant]) -> CachedBatch | None:
        affected = list(nb.entries) + (list(cached.request_ids) if cached is not None else [])
        try:
            async with self.forward_lock:
                # The shard sizes later chunks with the router's budget, not the one it warmed up with.
                result = await self._client.prefill(
                    nb.batch, cached, self._config.max_batch_prefill_tokens, grants if cached is not None else ()
                )
        except Exception as err:  # noqa: BLE001 - any failure of one step fails only that step's requests
            await self._fail([nb.batch.id] + ([cached.id] if cached else []), affected, _as_error(err))
            return None
        return await self._apply(result)

    def decode_steps(self) -> int:
        """Steps for the next Decode when no request waits (the scheduler asks for one while any does):
        decode_steps, or more while steps are short, to about decode_call_ns of forward per call (the last
        full call's forward per step says how many; at most MAX_ADAPTIVE_DECODE_STEPS)."""
        base = self._config.decode_steps
        if base <= 1 or self._config.decode_call_ns <= 0 or self._step_ns is None:
            return base
        wanted = math.ceil(self._config.decode_call_ns / self._step_ns)
        return max(base, min(wanted, MAX_ADAPTIVE_DECODE_STEPS))

    async def _decode(self, running: CachedBatch, plan: StepPlan) -> CachedBatch | None:
        try:
            async with self.forward_lock:
                result = await self._client.decode([running], plan.steps, plan.grants)
        except Exception as err:  # noqa: BLE001 - see _prefill
            await self._fail([running.id], list(running.request_ids), _as_error(err))
            return None
        if result.batch is not None and result.timings.forward_ns > 0:  # every step ran (none stopped early)
            self._step_ns = result.timings.forward_ns / plan.steps
        return await self._apply(result)

    async def _apply(self, result: StepResult) -> CachedBatch | None:
        """Route generations to their clients, end what finished, and filter the shard batch."""
        cached, kept = self.scheduler.update(result)
        if cached is None:
            return None
        return await self._keep(cached, kept)

    async def _keep(self, cached: CachedBatch, kept: list[int]) -> CachedBatch | None:
        """The shard's batch with only `kept` (FilterBatch; ClearCache when none is left)."""
        if len(kept) == cached.size:
            return cached
        try:
            if not kept:
                await self._client.clear_cache(cached.id)
                return None
            return await self._client.filter_batch(cached.id, kept)
        except Exception as err:  # noqa: BLE001 - see _prefill
            await self._fail([cached.id], kept, _as_error(err))
            return None

    async def _fail(self, batch_ids: Sequence[int], request_ids: Sequence[int], err: TgictlError) -> None:
        """A shard step failed: exactly its requests fail; their shard state is dropped; we go on."""
        log.error("batch %s failed: %s", list(batch_ids), err)
        self._on_error(err)
        self.scheduler.fail(request_ids, err)
        for batch_id in batch_ids:
            try:
                await self._client.clear_cache(batch_id)
            except TgictlError as clear_err:
                log.error("clear_cache(%s) failed after a batch error: %s", batch_id, clear_err)


def _as_error(err: Exception) -> TgictlError:
    """A step's failure as the error its clients get: typed errors as they are, anything else (a
    message that would not convert, a transport surprise) as a generation error naming it."""
    return err if isinstance(err, TgictlError) else GenerationError(f"Server error: {type(err).__name__}: {err}")
