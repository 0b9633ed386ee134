"""The continuous-batching task: one asyncio task owns every in-flight request (docs/architecture.md,
"Scheduling").

Each step is one forward on the shards: a Prefill when waiting requests can be admitted (it carries
the running batch, which the shard concatenates into one mixed forward of prompt chunks and decode
rows), else a Decode. Finished, stopped and disconnected requests leave the batch before the next
step; their blocks go back to the allocator, with only computed tokens published. A request whose
round ended with tokens still owed is queued again at the head (see entry.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tgictl.config import MAX_ADAPTIVE_DECODE_STEPS
from tgictl.errors import GenerationError, TgictlError, ValidationError
from tgictl.proto.messages import Batch, CachedBatch, StepResult
from tgictl.runtime.router.kv.block_allocator import KvAllocator
from tgictl.runtime.router.request import ErrorEvent, ValidatedRequest
from tgictl.runtime.router.scheduling.entry import Entry, TokenTexts
from tgictl.runtime.router.scheduling.event_channel import EventChannel
from tgictl.runtime.router.scheduling.queue import NextBatch, Queue

log = logging.getLogger(__name__)


class ShardClient(Protocol):
    """The calls the batcher makes; ShardedClient implements them over gRPC."""

    async def prefill(
        self, batch: Batch, cached: CachedBatch | None, max_prefill_tokens: int | None = None
    ) -> StepResult: ...

    async def decode(self, batches: Sequence[CachedBatch], steps: int = 1) -> StepResult: ...

    async def filter_batch(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch: ...

    async def clear_cache(self, batch_id: int | None) -> None: ...


@dataclass(frozen=True)
class BatcherConfig:
    max_batch_prefill_tokens: int
    max_batch_size: int | None = None
    decode_steps: int = 1  # per Decode while the queue is empty (RouterConfig.decode_steps)
    decode_call_ns: int = 0  # more steps while they are short, to about this forward per call (RouterConfig)


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
        self._queue = queue
        self._allocator = allocator
        self._texts = texts
        self._config = config
        self._on_error = on_error
        self._states: dict[int, Entry] = {}  # in flight, by the id of their current round
        self._step_ns: float | None = None  # forward per step of the last Decode whose steps all ran
        self._wakeup = asyncio.Event()
        # Held around every forward; /health's probe forward takes it too (health.py), so the shards
        # always see one forward at a time, in the same order on every rank.
        self.forward_lock = asyncio.Lock()

    @property
    def in_flight(self) -> int:
        return len(self._states)

    def entries(self) -> list[Entry]:
        """The in-flight entries (a copy: the batching task changes the set)."""
        return list(self._states.values())

    def entry(self, request_id: int) -> Entry | None:
        """The in-flight entry of a shard request id (tracing links a batch to its requests)."""
        return self._states.get(request_id)

    def enqueue(self, entry: Entry) -> int:
        request_id = self._queue.append(entry)
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
                log.exception("batching loop failed; failing %d in-flight requests", len(self._states))
                await self._fail([], list(self._states), GenerationError(f"Server error: {err}"))
                await self._clear_all()

    async def _clear_all(self) -> None:
        try:
            await self._client.clear_cache(None)
        except TgictlError as err:
            log.error("clear_cache(all) failed: %s", err)

    async def _serve_until_idle(self) -> None:
        self._queue.drop_cancelled()
        running: CachedBatch | None = None
        while True:
            running, admitted = await self._admit(running)
            if admitted:
                continue  # that Prefill already advanced every running request by one step
            if running is None:
                return
            running = await self._decode(running)

    async def _admit(self, running: CachedBatch | None) -> tuple[CachedBatch | None, bool]:
        """Try to start waiting requests beside the running ones; returns the batch to go on with."""
        config = self._config
        self._queue.drop_cancelled()
        size = running.size if running is not None else 0
        max_size = None if config.max_batch_size is None else config.max_batch_size - size
        prefill_budget = config.max_batch_prefill_tokens - (running.current_tokens if running is not None else 0)
        # No token budget beside the allocator: it is the real one, and it counts blocks shared through
        # the prefix cache once (TGI's token_budget is for its backends without a block allocator).
        nb = self._queue.next_batch(max_size, prefill_budget)
        if nb is None:
            return running, False
        return await self._prefill(nb, running), True

    async def _prefill(self, nb: NextBatch, cached: CachedBatch | None) -> CachedBatch | None:
        for request_id, entry in nb.entries.items():
            entry.start(self._texts)
            self._states[request_id] = entry
        affected = list(nb.entries) + (list(cached.request_ids) if cached is not None else [])
        try:
            async with self.forward_lock:
                # The shard sizes later chunks with the router's budget, not the one it warmed up with.
                result = await self._client.prefill(nb.batch, cached, self._config.max_batch_prefill_tokens)
        except Exception as err:  # noqa: BLE001 - any failure of one step fails only that step's requests
            await self._fail([nb.batch.id] + ([cached.id] if cached else []), affected, _as_error(err))
            return None
        return await self._apply(result)

    def decode_steps(self) -> int:
        """Steps for the next Decode: one while a request waits (it may join after every step); else
        decode_steps, or more while steps are short, to about decode_call_ns of forward per call (the last
        full call's forward per step says how many; at most MAX_ADAPTIVE_DECODE_STEPS)."""
        base = self._config.decode_steps
        if len(self._queue):
            return 1
        if base <= 1 or self._config.decode_call_ns <= 0 or self._step_ns is None:
            return base
        wanted = math.ceil(self._config.decode_call_ns / self._step_ns)
        return max(base, min(wanted, MAX_ADAPTIVE_DECODE_STEPS))

    async def _decode(self, running: CachedBatch) -> CachedBatch | None:
        steps = self.decode_steps()
        try:
            async with self.forward_lock:
                result = await self._client.decode([running], steps)
        except Exception as err:  # noqa: BLE001 - see _prefill
            await self._fail([running.id], list(running.request_ids), _as_error(err))
            return None
        if result.batch is not None and result.timings.forward_ns > 0:  # every step ran (none stopped early)
            self._step_ns = result.timings.forward_ns / steps
        return await self._apply(result)

    async def _apply(self, result: StepResult) -> CachedBatch | None:
        """Route generations to their clients, end what finished, and filter the shard batch."""
        for generation in result.generations:
            entry = self._states.get(generation.request_id)
            if entry is None:
                continue  # already ended by the router (stop string, disconnect) in an earlier step
            if entry.is_cancelled():
                self._finish(entry)
                continue
            entry.on_generation(generation)
            if generation.error and not entry.finished:
                # The shard ended this request alone (its grammar failed) and goes on with the rest. Its
                # computed KV is sound, so it is published like any finished request's.
                entry.send(ErrorEvent(error=ValidationError(generation.error)))
                self._finish(entry)
            elif entry.finished or entry.continues:
                self._finish(entry)
        cached = result.batch
        if cached is None:
            return None
        for request_id in cached.request_ids:
            entry = self._states.get(request_id)
            if entry is not None and entry.is_cancelled():
                self._finish(entry)
        kept = [rid for rid in cached.request_ids if rid in self._states]
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

    def _finish(self, entry: Entry) -> None:
        """The entry leaves the running batch: its blocks are freed, computed tokens published; a
        continuation goes back to the head of the queue as its next round."""
        if entry.allocation is not None:
            # Before leaving _states: should free() raise, run() still fails this entry's stream.
            self._allocator.free(entry.allocation, entry.computed_tokens())
            entry.allocation = None
        self._states.pop(entry.id, None)
        if entry.continues and not entry.is_cancelled():
            entry.next_round()
            self._queue.append(entry, first=True)

    async def _fail(self, batch_ids: Sequence[int], request_ids: Sequence[int], err: TgictlError) -> None:
        """A shard step failed: exactly its requests fail; their shard state is dropped; we go on."""
        log.error("batch %s failed: %s", list(batch_ids), err)
        self._on_error(err)
        error = err if isinstance(err, GenerationError) else GenerationError(str(err))
        for request_id in request_ids:
            entry = self._states.pop(request_id, None)
            if entry is None:
                continue
            entry.send(ErrorEvent(error=error))
            if entry.allocation is not None:
                # The KV of a failed batch is not trusted: nothing is published.
                self._allocator.free(entry.allocation, None)
                entry.allocation = None
        for batch_id in batch_ids:
            try:
                await self._client.clear_cache(batch_id)
            except TgictlError as clear_err:
                log.error("clear_cache(%s) failed after a batch error: %s", batch_id, clear_err)


def _as_error(err: Exception) -> TgictlError:
    """A step's failure as the error its clients get: typed errors as they are, anything else (a
    message that would not convert, a transport surprise) as a generation error naming it."""
    return err if isinstance(err, TgictlError) else GenerationError(f"Server error: {type(err).__name__}: {err}")
