"""ShardedClient: the router's gRPC client, fanning every call out to all shards (TGI's backends/v3/src/client/sharded_client.rs).

Every rank computes the same tokens (tensor parallelism gathers the logits), but only rank 0 fills
`generations` (see generate.proto); the others answer with the same CachedBatch, which we check, so a
desynchronised rank is an error instead of silent garbage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc
import grpc.aio

from tgictl.errors import GenerationError, ShardConnectionError, TgictlError
from tgictl.proto import convert
from tgictl.proto import generate_pb2 as pb
from tgictl.proto.generate_pb2_grpc import TextGenerationServiceStub
from tgictl.proto.messages import (
    Batch,
    BlockGrant,
    CachedBatch,
    ClearCacheRequest,
    DecodeRequest,
    FilterBatchRequest,
    Info,
    LoadAdapterRequest,
    PrefillRequest,
    StepResult,
    WarmupRequest,
    WarmupResult,
)
from tgictl.runtime.router.adapters import AdapterError
from tgictl.tracing import grpc_metadata

T = TypeVar("T")
# Messages can be large (prompt logprobs of long batches); TGI lifts gRPC's 4 MiB default the same way.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.max_send_message_length", 2**31 - 1),
]
_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED}


def _uds_target(path_or_url: str) -> str:
    return path_or_url if path_or_url.startswith("unix://") else f"unix://{path_or_url}"


def _error(err: grpc.aio.AioRpcError) -> TgictlError:
    details = err.details() or str(err.code())
    if err.code() in _UNREACHABLE:
        return ShardConnectionError(f"Could not connect to Text Generation server: {details}")
    return GenerationError(f"Request failed during generation: Server error: {details}")


class ShardedClient:
    def __init__(self, urls: Sequence[str], channels: Sequence[grpc.aio.Channel]) -> None:
        self.urls = tuple(urls)
        self._channels = list(channels)
        self._stubs = [TextGenerationServiceStub(c) for c in channels]

    @classmethod
    async def connect(cls, master_uds_path: str, timeout_s: float = 10.0) -> ShardedClient:
        """Connect to rank 0, discover every rank, and open one channel each."""
        master = grpc.aio.insecure_channel(_uds_target(master_uds_path), options=_CHANNEL_OPTIONS)
        try:
            reply = await TextGenerationServiceStub(master).ServiceDiscovery(
                pb.ServiceDiscoveryRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as err:
            await master.close()
            raise _error(err) from None
        await master.close()
        urls = list(reply.urls)
        channels = [grpc.aio.insecure_channel(_uds_target(u), options=_CHANNEL_OPTIONS) for u in urls]
        return cls(urls, channels)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels))

    async def _all(
        self, call: Callable[[TextGenerationServiceStub], Awaitable[T]],
        refusal: Callable[[str], TgictlError] | None = None,
    ) -> list[T]:
        """`refusal`: the error for a shard's INVALID_ARGUMENT, when that is the caller's mistake."""
        results = await asyncio.gather(*(call(stub) for stub in self._stubs), return_exceptions=True)
        for result in results:
            if isinstance(result, grpc.aio.AioRpcError):
                if refusal is not None and result.code() is grpc.StatusCode.INVALID_ARGUMENT:
                    raise refusal(result.details() or "the shard refused the request")
                raise _error(result)
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]

    async def info(self) -> Info:
        replies = await self._all(lambda s: s.Info(pb.InfoRequest()))
        return convert.info_from_pb(replies[0])

    async def health(self, timeout_s: float = 5.0) -> None:
        await self._all(lambda s: s.Health(pb.HealthRequest(), timeout=timeout_s))

    async def clear_cache(self, batch_id: int | None) -> None:
        message = convert.clear_cache_request_to_pb(ClearCacheRequest(batch_id))
        await self._all(lambda s: s.ClearCache(message))

    async def filter_batch(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch:
        message = convert.filter_batch_request_to_pb(FilterBatchRequest(batch_id, tuple(request_ids)))
        replies = await self._all(lambda s: s.FilterBatch(message))
        batches = [convert.filter_batch_response_from_pb(r) for r in replies]
        _check_same_batch(batches)
        return batches[0]

    async def warmup(self, request: WarmupRequest) -> WarmupResult:
        message = convert.warmup_request_to_pb(request)
        replies = [convert.warmup_response_from_pb(r) for r in await self._all(lambda s: s.Warmup(message))]
        # Every rank must fit the result, so the smallest answer wins.
        return WarmupResult(
            max_supported_total_tokens=min(r.max_supported_total_tokens for r in replies),
            max_input_tokens=min(r.max_input_tokens for r in replies),
            max_total_tokens=min(r.max_total_tokens for r in replies),
            local_blocks=min(r.local_blocks for r in replies),
        )

    async def prefill(
        self, batch: Batch, cached: CachedBatch | None, max_prefill_tokens: int | None = None,
        grants: Sequence[BlockGrant] = (),
    ) -> StepResult:
        message = convert.prefill_request_to_pb(PrefillRequest(batch, cached, max_prefill_tokens, tuple(grants)))
        metadata = grpc_metadata()  # the batch span's trace context, when tracing is on
        replies = await self._all(lambda s: s.Prefill(message, metadata=metadata))
        return _merge([convert.prefill_response_from_pb(r) for r in replies])

    async def load_adapter(self, request: LoadAdapterRequest) -> None:
        """Every rank reads the adapter; one that does not fit the model or cannot be read is a 400 with the
        shard's words."""
        message = convert.load_adapter_request_to_pb(request)
        await self._all(lambda s: s.LoadAdapter(message), refusal=AdapterError)

    async def unload_adapter(self, adapter_index: int) -> None:
        message = convert.unload_adapter_request_to_pb(adapter_index)
        await self._all(lambda s: s.UnloadAdapter(message), refusal=AdapterError)

    async def decode(
        self, batches: Sequence[CachedBatch], steps: int = 1, grants: Sequence[BlockGrant] = ()
    ) -> StepResult:
        message = convert.decode_request_to_pb(DecodeRequest(tuple(batches), steps, tuple(grants)))
        metadata = grpc_metadata()
        replies = await self._all(lambda s: s.Decode(message, metadata=metadata))
        return _merge([convert.decode_response_from_pb(r) for r in replies])


def _check_same_batch(batches: Sequence[CachedBatch | None]) -> None:
    first = batches[0]
    for rank, other in enumerate(batches[1:], start=1):
        same = (first is None and other is None) or (
            first is not None and other is not None and first.request_ids == other.request_ids
        )
        if not same:
            raise GenerationError(f"Request failed during generation: shard {rank} is out of step with shard 0")


def _merge(results: Sequence[StepResult]) -> StepResult:
    """Rank 0's generations and batch, checked against the others; the slowest rank's timings."""
    _check_same_batch([r.batch for r in results])
    slowest = max(results, key=lambda r: r.timings.total_ns)
    return StepResult(generations=results[0].generations, batch=results[0].batch, timings=slowest.timings)

