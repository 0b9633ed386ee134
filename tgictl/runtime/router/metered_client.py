"""The shard client as the batcher sees it, with TGI's batch metrics recorded around every call.

Wrapping the client keeps the batcher free of metrics code: every step it takes is a Prefill or a
Decode through here, so counts, durations and batch sizes are measured at the one place they happen.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from tgictl.errors import TgictlError
from tgictl.proto.messages import Batch, BlockGrant, CachedBatch, StepResult
from tgictl.runtime.router.metrics import RouterMetrics
from tgictl.runtime.router.scheduling.batcher import ShardClient

T = TypeVar("T")


class MeteredClient:
    def __init__(self, client: ShardClient, metrics: RouterMetrics) -> None:
        self._client = client
        self._metrics = metrics

    async def _step(self, method: str, call: Awaitable[StepResult]) -> StepResult:
        m = self._metrics
        m.batch_count.labels(method=method).inc()
        start = time.perf_counter()
        try:
            result = await call
        except TgictlError:
            m.batch_failure.labels(method=method).inc()
            raise
        m.batch_success.labels(method=method).inc()
        m.batch_inference_duration.labels(method=method).observe(time.perf_counter() - start)
        timings = result.timings
        m.batch_forward_duration.labels(method=method).observe(timings.forward_ns / 1e9)
        m.batch_decode_duration.labels(method=method).observe(timings.decode_ns / 1e9)
        if timings.concat_ns is not None:
            m.batch_concat_duration.labels(method=method).observe(timings.concat_ns / 1e9)
        self._observe_speculation(result)
        batch = result.batch
        m.batch_current_size.set(batch.size if batch is not None else 0)
        m.batch_current_max_tokens.set(batch.max_tokens if batch is not None else 0)
        return result

    def _observe_speculation(self, result: StepResult) -> None:
        m = self._metrics
        for generation in result.generations:
            if generation.draft_tokens:
                m.speculative_draft_tokens.inc(generation.draft_tokens)
                m.speculative_accepted_tokens.inc(generation.accepted_tokens)
                m.skipped_tokens.observe(generation.accepted_tokens)

    async def prefill(
        self, batch: Batch, cached: CachedBatch | None, max_prefill_tokens: int | None = None,
        grants: Sequence[BlockGrant] = (),
    ) -> StepResult:
        m = self._metrics
        m.batch_next_size.observe(batch.size)
        if cached is not None:
            m.batch_concat.labels(reason="chunking").inc()
        m.prompt_tokens.inc(sum(len(r.input_ids) for r in batch.requests))
        m.prefix_cache_hit_tokens.inc(sum(r.cache_len for r in batch.requests))
        return await self._step("prefill", self._client.prefill(batch, cached, max_prefill_tokens, grants))

    async def decode(
        self, batches: Sequence[CachedBatch], steps: int = 1, grants: Sequence[BlockGrant] = ()
    ) -> StepResult:
        if len(batches) > 1:
            self._metrics.batch_concat.labels(reason="backpressure").inc()
        return await self._step("decode", self._client.decode(batches, steps, grants))

    async def filter_batch(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch:
        start = time.perf_counter()
        cached = await self._client.filter_batch(batch_id, request_ids)
        self._metrics.batch_filter_duration.labels(method="decode").observe(time.perf_counter() - start)
        return cached

    async def clear_cache(self, batch_id: int | None) -> None:
        await self._client.clear_cache(batch_id)
