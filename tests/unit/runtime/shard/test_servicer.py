"""The servicer in process: a grpc.aio server on a Unix socket around a real runtime (tiny llama).

Covers what the subprocess tests cannot reach cheaply: concurrent RPCs serialise on the device
thread with the same results as one at a time, and the single error mapping turns an unexpected
failure into INTERNAL, reports it once, and refuses every later RPC.
"""

from __future__ import annotations

import asyncio
import threading
import re
from pathlib import Path

import grpc
import grpc.aio
import pytest
import torch
from servicer_helpers import paged_request, serving

from tgictl.proto import convert
from tgictl.proto import generate_pb2 as pb
from tgictl.proto.messages import (
    Batch,
    DecodeRequest,
    PrefillRequest,
    Request,
    SamplingParams,
    StoppingParams,
)
from tgictl.runtime.shard.host_memory import release_free_memory
from tgictl.runtime.shard.servicer import DeviceWorker


def test_concurrent_prefills_equal_sequential_ones(tiny_model_dir: Path, tmp_path: Path) -> None:
    batches = [Batch(i, (paged_request(i, 1 + 4 * i, tuple(range(10 + i, 30 + i))),)) for i in range(1, 5)]
    messages = [convert.prefill_request_to_pb(PrefillRequest(b)) for b in batches]

    async def body() -> None:
        async with serving(tiny_model_dir, tmp_path / "s", []) as (stub, servicer):
            sequential = [await stub.Prefill(m) for m in messages]
            await stub.ClearCache(pb.ClearCacheRequest())  # a prefill rewrites every slot it reads
            concurrent = await asyncio.gather(*(stub.Prefill(m) for m in messages))
            assert sorted(servicer.store.ids) == [1, 2, 3, 4]
        for one, other in zip(sequential, concurrent):
            assert list(one.generations) == list(other.generations)
            assert one.batch == other.batch

    asyncio.run(body())


def test_an_unexpected_failure_is_internal_reported_once_and_stops_service(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    fatal: list[str] = []

    async def body() -> None:
        async with serving(tiny_model_dir, tmp_path / "s", fatal) as (stub, servicer):
            servicer.runtime.runner.kv_cache = None  # type: ignore[assignment]  # the device state is gone
            step = convert.prefill_request_to_pb(PrefillRequest(Batch(7, (paged_request(7, 1, (3, 60, 4)),))))
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.Prefill(step)
            assert failure.value.code() == grpc.StatusCode.INTERNAL
            assert failure.value.details().startswith("AttributeError: ")
            for call in (stub.Info(pb.InfoRequest()), stub.Health(pb.HealthRequest())):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "shard is stopping after an error: AttributeError" in refused.value.details()

    asyncio.run(body())
    assert len(fatal) == 1 and fatal[0].startswith("AttributeError: ")


def test_health_answers_from_state_without_waiting_for_the_device_thread(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A busy shard is healthy: Health answers while a device job still runs. One job running longer than
    --health-step-timeout (a hung step) is UNAVAILABLE, naming it, and reporting it stops nothing."""
    fatal: list[str] = []
    release = threading.Event()

    async def body() -> None:
        async with serving(tiny_model_dir, tmp_path / "s", fatal, health_step_timeout_s=0.2) as (stub, servicer):
            servicer.worker.post(release.wait, 60.0, name="a long step")
            while servicer.worker.running() is None:
                await asyncio.sleep(0.01)
            assert await stub.Health(pb.HealthRequest()) == pb.HealthResponse()  # before the bound: healthy
            assert not release.is_set()  # it answered while the job still held the device thread
            while servicer.worker.running()[1] <= 0.2:  # type: ignore[index]
                await asyncio.sleep(0.02)
            with pytest.raises(grpc.aio.AioRpcError) as stalled:
                await stub.Health(pb.HealthRequest())
            assert stalled.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "(a long step)" in stalled.value.details() and "--health-step-timeout" in stalled.value.details()
            release.set()
            while servicer.worker.running() is not None:
                await asyncio.sleep(0.01)
            assert await stub.Health(pb.HealthRequest()) == pb.HealthResponse()

    asyncio.run(body())
    assert fatal == []


def test_an_invalid_request_is_not_fatal(tiny_model_dir: Path, tmp_path: Path) -> None:
    fatal: list[str] = []

    async def body() -> None:
        async with serving(tiny_model_dir, tmp_path / "s", fatal) as (stub, _):
            bad = convert.prefill_request_to_pb(PrefillRequest(Batch(7, (paged_request(7, 1, (3, 600, 4)),))))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Prefill(bad)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert await stub.Health(pb.HealthRequest()) == pb.HealthResponse()

    asyncio.run(body())
    assert fatal == []


def test_later_chunks_follow_the_routers_prefill_budget(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Warmup said 32 tokens per forward; the router's Prefill says 8: the prompt's later chunks are 8."""
    prompt = tuple(range(40, 70))  # 30 tokens, first chunk 8
    first = Request(1, prompt, SamplingParams(), StoppingParams(2), blocks=(1, 2), chunk_len=8)

    async def body() -> list[int]:
        async with serving(tiny_model_dir, tmp_path / "s", []) as (stub, servicer):
            reply = await stub.Prefill(convert.prefill_request_to_pb(PrefillRequest(Batch(1, (first,)), None, 8)))
            currents = [reply.batch.current_tokens]
            while reply.batch.current_tokens > 1:
                cached = convert.cached_batch_from_pb(reply.batch)
                reply = await stub.Decode(convert.decode_request_to_pb(DecodeRequest((cached,))))
                currents.append(reply.batch.current_tokens)
            assert servicer.runtime.runner.max_prefill_tokens == 8
            return currents

    assert asyncio.run(body()) == [8, 8, 6, 1]  # 8 done, then 8 + 8 + 6 = 30, then decoding


def test_a_job_whose_client_left_is_reported_as_abandoned() -> None:
    """What lets a shard stopped mid-warmup exit 0: the job still running has nobody waiting."""
    import threading

    release = threading.Event()

    def warmup() -> str:
        release.wait(5)
        return "done"

    async def scenario() -> tuple[list[str], list[str]]:
        worker = DeviceWorker()
        waiting = asyncio.ensure_future(worker.run(warmup, name="warmup"))
        await asyncio.sleep(0.05)
        still_waited = worker.abandoned()  # its client still waits: not abandoned
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        gone = worker.abandoned()
        release.set()
        assert worker.drain(5)
        worker.shutdown()
        return still_waited, gone

    still_waited, gone = asyncio.run(scenario())
    assert still_waited == [] and gone == ["warmup"]


def _rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").is_file() or not release_free_memory(),
                    reason="needs glibc's malloc_trim and /proc (Linux)")
def test_the_shard_gives_freed_heap_back_once_it_has_stayed_idle(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Freed memory on the device thread's heap (as a long prompt's activations leave it) goes back to the
    OS once the shard has held no batch for the idle delay, not only every TRIM_EVERY_STEPS steps; and not
    at once, so back-to-back prompts do not fault the same pages in again."""

    def litter() -> torch.Tensor:
        parts = [torch.ones(16384) for _ in range(4096)]  # 256 MiB in 64 KiB pieces: on the heap, not mmap
        keep = torch.zeros(8)  # allocated last: the freed pieces are not all at the heap's top
        del parts
        return keep

    delay = 1.0

    async def body() -> tuple[float, float, float, float]:
        async with serving(tiny_model_dir, tmp_path / "s", [], idle_trim_delay_s=delay) as (stub, servicer):
            before = _rss_mib()
            keep = servicer.worker.call(litter)
            littered = _rss_mib()
            finished = Batch(1, (paged_request(1, 1, tuple(range(10, 30)), new=1),))
            reply = await stub.Prefill(convert.prefill_request_to_pb(PrefillRequest(finished)))
            assert not reply.HasField("batch") and len(servicer.store) == 0
            assert servicer.worker.drain(10)
            at_once = _rss_mib()
            await asyncio.sleep(delay + 0.5)
            assert servicer.worker.drain(10)  # the posted trim
            del keep
            return before, littered, at_once, _rss_mib()

    before, littered, at_once, idle = asyncio.run(body())
    assert littered > before + 192  # free() alone kept the pieces
    assert at_once > littered - 64  # no trim right after the step
    assert idle < littered - 192
