"""An in-process shard for the servicer tests: a grpc.aio server on a Unix socket around a real runtime."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import grpc.aio

from tgictl.proto import convert
from tgictl.proto.generate_pb2_grpc import TextGenerationServiceStub, add_TextGenerationServiceServicer_to_server
from tgictl.proto.messages import Batch, Request, SamplingParams, StoppingParams, WarmupRequest
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.runtime import ShardRuntime
from tgictl.runtime.shard.servicer import DeviceWorker, ShardServicer

BLOCK = 16


def paged_request(rid: int, first_block: int, prompt: tuple[int, ...], new: int = 4,
                  sampling: SamplingParams | None = None) -> Request:
    """A request on consecutive blocks from `first_block`, sampled (temperature 0.5, seeded) unless told."""
    tokens = len(prompt) + new - 1
    blocks = tuple(range(first_block, first_block + math.ceil(tokens / BLOCK)))
    sampling = sampling if sampling is not None else SamplingParams(temperature=0.5, seed=rid)
    return Request(rid, prompt, sampling, StoppingParams(new), blocks=blocks)


def _warmup() -> WarmupRequest:
    probe = Request(0, tuple(range(3, 35)), SamplingParams(), StoppingParams(1, ignore_eos=True))
    return WarmupRequest(batch=Batch(0, (probe,)), max_prefill_tokens=32)


@asynccontextmanager
async def serving(
    model_dir: Path, path: Path, fatal: list[str], lookahead: bool = True, idle_trim_delay_s: float = 60.0,
    health_step_timeout_s: float = 300.0,
) -> AsyncIterator[tuple[TextGenerationServiceStub, ShardServicer]]:
    runtime = ShardRuntime.load(model_dir, "float32", "cpu", DistContext.single(), kv_cache_memory=4 << 20)
    worker = DeviceWorker()
    servicer = ShardServicer(runtime, [f"unix://{path}"], worker=worker, on_fatal=fatal.append, lookahead=lookahead,
                              idle_trim_delay_s=idle_trim_delay_s, health_step_timeout_s=health_step_timeout_s)
    server = grpc.aio.server()
    add_TextGenerationServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix:{path}")
    try:
        stub = TextGenerationServiceStub(channel)
        await stub.Warmup(convert.warmup_request_to_pb(_warmup()))
        yield stub, servicer
    finally:
        await channel.close()
        await server.stop(None)
        worker.shutdown()
