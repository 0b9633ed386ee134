"""Look-ahead decoding (runtime/shard/lookahead.py): a router's sequence of RPCs gets the same tokens, finish
reasons and batches from a shard that steps ahead as from one that does not, through decodes, a filter after
the kept step, a prefill that joins the running batch, a decode of two batches, rows that finish inside the
kept step, and clears;
the kept steps are really used; a failed kept step surfaces on the RPC that asks for it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from servicer_helpers import paged_request, serving

from tgictl.env import FaultInjection
from tgictl.proto import convert
from tgictl.proto import generate_pb2 as pb
from tgictl.proto.messages import Batch, CachedBatch, DecodeRequest, PrefillRequest, SamplingParams, StepResult
from tgictl.runtime.shard.faults import StepFaults

GREEDY = SamplingParams()


def _view(result: StepResult) -> tuple[Any, ...]:
    """What the router reads of a step, logprobs aside (they may differ in float rounding: a kept step ran
    the batch before its filter)."""
    gens = tuple((g.request_id, g.tokens.ids, g.generated_text) for g in result.generations)
    return gens, result.batch


async def _script(stub: Any) -> tuple[list[tuple[Any, ...]], list[list[float]]]:
    """The RPCs a router would send; each step's view and logprobs."""
    views: list[tuple[Any, ...]] = []
    logprobs: list[list[float]] = []

    def seen(result: StepResult) -> StepResult:
        views.append(_view(result))
        logprobs.append([lp for g in result.generations for lp in g.tokens.logprobs])
        return result

    async def prefill(batch: Batch, cached: CachedBatch | None = None) -> StepResult:
        reply = await stub.Prefill(convert.prefill_request_to_pb(PrefillRequest(batch, cached)))
        return seen(convert.prefill_response_from_pb(reply))

    async def decode(*cached: CachedBatch) -> StepResult:
        reply = await stub.Decode(convert.decode_request_to_pb(DecodeRequest(cached)))
        return seen(convert.decode_response_from_pb(reply))

    async def filter_batch(batch_id: int, ids: list[int]) -> CachedBatch:
        cached = convert.filter_batch_response_from_pb(
            await stub.FilterBatch(pb.FilterBatchRequest(batch_id=batch_id, request_ids=ids)))
        views.append(("filter", cached))
        return cached

    step = await prefill(Batch(1, (paged_request(1, 1, tuple(range(10, 30)), 8),
                                   paged_request(2, 4, (5, 6, 7, 8, 9), 12, GREEDY),
                                   paged_request(3, 7, tuple(range(100, 109)), 3))))
    for _ in range(2):
        step = await decode(step.batch)
    assert [g.request_id for g in step.generations if g.generated_text is not None] == [3]
    cached = await filter_batch(1, [2])  # request 1 stopped by the router (a stop string, say)
    step = await decode(cached)
    joined = Batch(2, (paged_request(4, 10, tuple(range(200, 240)), 6, GREEDY),))
    step = await prefill(joined, step.batch)  # the new request joins the running one
    for _ in range(3):
        step = await decode(step.batch)
    # A second batch prefilled on its own, then both in one Decode: the first from its kept step.
    other = await prefill(Batch(5, (paged_request(8, 40, (9, 10, 11, 12), 5),)))
    step = await decode(step.batch, other.batch)
    await stub.ClearCache(pb.ClearCacheRequest(id=step.batch.id))
    # Request 5 finishes inside the kept step while the router stops request 6: its last token still comes.
    step = await prefill(Batch(3, (paged_request(5, 20, (1, 2, 3), 2, GREEDY), paged_request(6, 22, (4, 5), 9))))
    cached = await filter_batch(3, [5])
    step = await decode(cached)
    assert step.batch is None and step.generations[0].generated_text is not None
    # A batch that ends inside its kept step can still be cleared.
    step = await prefill(Batch(4, (paged_request(7, 30, (6, 7, 8), 2, GREEDY),)))
    await stub.ClearCache(pb.ClearCacheRequest(id=4))
    return views, logprobs


def test_stepping_ahead_changes_nothing_the_router_sees(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def body(lookahead: bool) -> tuple[list[tuple[Any, ...]], list[list[float]], tuple[int, int]]:
        async with serving(tiny_model_dir, tmp_path / f"s{int(lookahead)}", [], lookahead=lookahead) as (stub, servicer):
            views, logprobs = await _script(stub)
            return views, logprobs, (servicer.ahead.steps_run, servicer.ahead.steps_used)

    ahead_views, ahead_logprobs, (run, used) = asyncio.run(body(True))
    plain_views, plain_logprobs, plain_counts = asyncio.run(body(False))
    assert ahead_views == plain_views
    for ahead, plain in zip(ahead_logprobs, plain_logprobs):
        assert ahead == pytest.approx(plain, abs=1e-4)
    assert plain_counts == (0, 0)
    # every decode and the joining prefill were answered from a kept step; the two cleared batches' were not
    assert used == 9 and run == used + 2


def test_a_failed_kept_step_fails_the_rpc_that_asks_for_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tiny_model_dir, tmp_path / "s", []) as (stub, servicer):
            servicer._faults = StepFaults(FaultInjection(((2, 2),)))  # the second step: the kept one
            reply = await stub.Prefill(convert.prefill_request_to_pb(
                PrefillRequest(Batch(1, (paged_request(1, 1, (3, 4, 5), 4, GREEDY),)))))
            cached = convert.prefill_response_from_pb(reply).batch
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.Decode(convert.decode_request_to_pb(DecodeRequest((cached,))))
            assert failure.value.code() == grpc.StatusCode.ABORTED
            assert "injected fault" in failure.value.details()
            await stub.ClearCache(pb.ClearCacheRequest(id=1))  # as the router does after a failed step
            assert await stub.Health(pb.HealthRequest()) == pb.HealthResponse()

    asyncio.run(body())
