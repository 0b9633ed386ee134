"""The continuous-batching task: one asyncio task owns every in-flight request (reference 5.2).

Each step is one forward on the shards. With chunking, admitting work is a Prefill that carries the
running batch (the shard concatenates and runs one mixed forward), otherwise a Decode. Without
chunking, a new batch is prefilled on its own when the waiting_served_ratio / max_waiting_tokens rules
allow, then both are decoded together. Finished, stopped and disconnected requests leave the batch
before the next step; their blocks go back to the allocator, with only computed prompts published.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tgictl.errors import GenerationError, TgictlError
from tgictl.proto.messages import Batch, CachedBatch, StepResult
from tgictl.runtime.router.block_allocator import KvAllocator
from tgictl.runtime.router.queue import Entry, NextBatch, Queue
from tgictl.runtime.router.request import ErrorEvent
from tgictl.runtime.router.request_state import RequestState, TokenTexts

log = logging.getLogger(__name__)


class ShardClient(Protocol):
    """The calls the batcher makes; ShardedClient implements them over gRPC."""

    async def prefill(self, batch: Batch, cached: CachedBatch | None) -> StepResult: ...

    async def decode(self, batches: Sequence[CachedBatch]) -> StepResult: ...

    async def filter_batch(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch: ...

    async def clear_cache(self, batch_id: int | None) -> None: ...


@dataclass(frozen=True)
class BatcherConfig:
    max_batch_prefill_tokens: int
    max_batch_total_tokens: int
    max_batch_size: int | None = None
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20
    support_chunking: bool = True


@dataclass
class StepStats:
    """Figures of the last step, for metrics and the overhead benchmark."""

    method: str = ""
    batch_size: int = 0
    router_s: float = 0.0  # wall time of the RPC as the router saw it
    shard_total_s: float = 0.0  # the shard's own total_ns
    steps: int = 0


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
        self._states: dict[int, RequestState] = {}
        self._wakeup = asyncio.Event()
        self.stats = StepStats()

    @property
    def in_flight(self) -> int:
        return len(self._states)

    def enqueue(self, entry: Entry) -> int:
        request_id = self._queue.append(entry)
        self._wakeup.set()
        return request_id

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
        config = self._config
        self._queue.drop_cancelled()
        while True:
            first = self._next(
                None, config.max_batch_size, config.max_batch_prefill_tokens, config.max_batch_total_tokens
            )
            if first is None:
                return
            prefilled = await self._prefill(first, None)
            batches = [prefilled] if prefilled is not None else []
            waiting_steps = 1
            while batches:
                batches, admitted = await self._admit(batches, waiting_steps)
                waiting_steps = 1 if admitted else waiting_steps + 1
                if admitted and config.support_chunking:
                    continue  # that Prefill already advanced every running request by one step
                if batches:
                    batches = await self._decode(batches)

    def _next(self, min_size: int | None, max_size: int | None, prefill: int, tokens: int) -> NextBatch | None:
        return self._queue.next_batch(min_size, max_size, prefill, tokens)

    async def _admit(self, batches: list[CachedBatch], waiting_steps: int) -> tuple[list[CachedBatch], bool]:
        """Try to start waiting requests beside the running ones; returns the batches to go on with."""
        config = self._config
        self._queue.drop_cancelled()
        size = sum(b.size for b in batches)
        max_size = None if config.max_batch_size is None else config.max_batch_size - size
        token_budget = config.max_batch_total_tokens - sum(b.max_tokens for b in batches)
        if config.support_chunking:
            (cached,) = batches
            prefill_budget = config.max_batch_prefill_tokens - cached.current_tokens
            nb = self._next(None, max_size, prefill_budget, token_budget)
            if nb is None:
                return batches, False
            merged = await self._prefill(nb, cached)
            return ([merged] if merged is not None else []), True
        min_size = None if waiting_steps >= config.max_waiting_tokens else math.floor(size * config.waiting_served_ratio)
        nb = self._next(min_size or None, max_size, config.max_batch_prefill_tokens, token_budget)
        if nb is None:
            return batches, False
        new = await self._prefill(nb, None)
        return batches + ([new] if new is not None else []), True

    async def _prefill(self, nb: NextBatch, cached: CachedBatch | None) -> CachedBatch | None:
        for request_id, entry in nb.entries.items():
            self._states[request_id] = RequestState(entry, self._texts)
        affected = list(nb.entries) + (list(cached.request_ids) if cached is not None else [])
        try:
            result = await self._timed("prefill", self._client.prefill(nb.batch, cached))
        except Exception as err:  # noqa: BLE001 - any failure of one step fails only that step's requests
            await self._fail([nb.batch.id] + ([cached.id] if cached else []), affected, _as_error(err))
            return None
        return await self._apply(result)

    async def _decode(self, batches: list[CachedBatch]) -> list[CachedBatch]:
        affected = [rid for b in batches for rid in b.request_ids]
        try:
            result = await self._timed("decode", self._client.decode(batches))
        except Exception as err:  # noqa: BLE001 - see _prefill
            await self._fail([b.id for b in batches], affected, _as_error(err))
            return []
        cached = await self._apply(result)
        return [cached] if cached is not None else []

    async def _timed(self, method: str, call: Awaitable[StepResult]) -> StepResult:
        start = time.perf_counter()
        result = await call
        stats = self.stats
        stats.method = method
        stats.router_s = time.perf_counter() - start
        stats.shard_total_s = result.timings.total_ns / 1e9
        stats.batch_size = result.batch.size if result.batch is not None else len(result.generations)
        stats.steps += 1
        return result

    async def _apply(self, result: StepResult) -> CachedBatch | None:
        """Route generations to their clients, end what finished, and filter the shard batch."""
        for generation in result.generations:
            state = self._states.get(generation.request_id)
            if state is None:
                continue  # already ended by the router (stop string, disconnect) in an earlier step
            if state.entry.is_cancelled():
                self._finish(state)
                continue
            state.on_generation(generation)
            if state.finished:
                self._finish(state)
        cached = result.batch
        if cached is None:
            return None
        for request_id in cached.request_ids:
            state = self._states.get(request_id)
            if state is not None and state.entry.is_cancelled():
                self._finish(state)
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

    def _finish(self, state: RequestState) -> None:
        entry = state.entry
        self._states.pop(entry.id, None)
        if entry.allocation is not None:
            self._allocator.free(entry.allocation, state.computed_prompt())
            entry.allocation = None

    async def _fail(self, batch_ids: Sequence[int], request_ids: Sequence[int], err: TgictlError) -> None:
        """A shard step failed: exactly its requests fail; their shard state is dropped; we go on."""
        log.error("batch %s failed: %s", list(batch_ids), err)
        self._on_error(err)
        error = err if isinstance(err, GenerationError) else GenerationError(str(err))
        for request_id in request_ids:
            state = self._states.pop(request_id, None)
            if state is None:
                continue
            state.entry.send(ErrorEvent(error=error))
            if state.entry.allocation is not None:
                # The KV of a failed batch is not trusted: nothing is published.
                self._allocator.free(state.entry.allocation, None)
                state.entry.allocation = None
        for batch_id in batch_ids:
            try:
                await self._client.clear_cache(batch_id)
            except TgictlError as clear_err:
                log.error("clear_cache(%s) failed after a batch error: %s", batch_id, clear_err)


def _as_error(err: Exception) -> TgictlError:
    """A step's failure as the error its clients get: typed errors as they are, anything else (a
    message that would not convert, a transport surprise) as a generation error naming it."""
    return err if isinstance(err, TgictlError) else GenerationError(f"Server error: {type(err).__name__}: {err}")
