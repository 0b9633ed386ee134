"""The shard client with one OpenTelemetry span per Prefill and Decode (docs/architecture.md,
"Tracing"). A batch serves many requests, so its span links to every request's span rather than
belonging to one; it is the current span during the RPC, so the shard client sends its context in
the gRPC metadata and the shard's own span for the step is its child. Only in the chain when
tracing is on."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from opentelemetry.trace import SpanContext, SpanKind

from tgictl.proto.messages import Batch, BlockGrant, CachedBatch, StepResult
from tgictl.runtime.router.scheduling.batcher import ShardClient
from tgictl.tracing import links, tracer


class TracedClient:
    def __init__(self, client: ShardClient, request_trace: Callable[[int], SpanContext | None]) -> None:
        self._client = client
        self._request_trace = request_trace  # shard request id → the request's span context

    def _links(self, request_ids: Iterable[int]) -> list:  # type: ignore[type-arg]
        return links(self._request_trace(i) for i in request_ids)

    async def prefill(
        self, batch: Batch, cached: CachedBatch | None, max_prefill_tokens: int | None = None,
        grants: Sequence[BlockGrant] = (),
    ) -> StepResult:
        ids = [r.id for r in batch.requests] + list(cached.request_ids if cached is not None else ())
        attributes = {"tgictl.batch.new_requests": batch.size, "tgictl.batch.size": len(ids),
                      "tgictl.batch.prefill_tokens": sum(len(r.input_ids) - r.cache_len for r in batch.requests)}
        with tracer().start_as_current_span("prefill", kind=SpanKind.CLIENT, links=self._links(ids),
                                            attributes=attributes):
            return await self._client.prefill(batch, cached, max_prefill_tokens, grants)

    async def decode(
        self, batches: Sequence[CachedBatch], steps: int = 1, grants: Sequence[BlockGrant] = ()
    ) -> StepResult:
        ids = [i for b in batches for i in b.request_ids]
        with tracer().start_as_current_span("decode", kind=SpanKind.CLIENT, links=self._links(ids),
                                            attributes={"tgictl.batch.size": len(ids), "tgictl.batch.steps": steps}):
            return await self._client.decode(batches, steps, grants)

    async def filter_batch(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch:
        return await self._client.filter_batch(batch_id, request_ids)

    async def clear_cache(self, batch_id: int | None) -> None:
        await self._client.clear_cache(batch_id)
