"""Helpers for the shard-process tests: start `tgictl shard` subprocesses and talk gRPC to them.

Each shard is `[sys.executable, "-m", "tgictl", "shard", ...]` with the repo root on PYTHONPATH,
logging to a file that failing tests print. `ShardConn` drives one socket through a grpc.aio stub on
a private event loop, so tests stay plain functions and see the real gRPC status codes.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from tgictl.proto import generate_pb2 as pb
from tgictl.proto.generate_pb2_grpc import TextGenerationServiceStub
from tgictl.proto.messages import (
    Batch,
    CachedBatch,
    Generation,
    Request,
    SamplingParams,
    StepResult,
    StoppingParams,
)
from tgictl.runtime.shard.batch import ShardBatch
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.runtime import ShardRuntime

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
BLOCK_SIZE = 16
KV_CACHE_MEMORY = 8 << 20  # 8 MiB: 1024 blocks of the tiny llama (8 KiB per block)
START_TIMEOUT_S = 90.0


class Oracle:
    """The runtime library in this process, with the same batch bookkeeping the router expects."""

    def __init__(self, model_dir: Path) -> None:
        self.runtime = ShardRuntime.load(
            model_dir, "float32", "cpu", DistContext.single(), block_size=BLOCK_SIZE, kv_cache_memory=KV_CACHE_MEMORY
        )
        self.batches: dict[int, ShardBatch] = {}

    def prefill(self, batch: Batch, cached_id: int | None = None) -> StepResult:
        cached = self.batches.pop(cached_id) if cached_id is not None else None
        generations, next_batch, _ = self.runtime.prefill(batch, cached)
        if next_batch is not None:
            next_batch.id = batch.id
        return self._keep(generations, next_batch)

    def decode(self, batch_ids: list[int]) -> StepResult:
        generations, next_batch, _ = self.runtime.decode([self.batches.pop(i) for i in batch_ids])
        return self._keep(generations, next_batch)

    def filter(self, batch_id: int, keep: tuple[int, ...]) -> CachedBatch:
        self.batches[batch_id] = self.batches[batch_id].filter(keep)
        return self.batches[batch_id].to_cached()

    def _keep(self, generations: list[Generation], next_batch: ShardBatch | None) -> StepResult:
        if next_batch is not None:
            self.batches[next_batch.id] = next_batch
        return StepResult(tuple(generations), next_batch.to_cached() if next_batch is not None else None)


def plain(value: Any) -> Any:
    """Generations as nested tuples with NaN spelled out (NaN != NaN would fail equal outputs)."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        return (type(value).__name__,) + tuple(plain(getattr(value, f)) for f in value.__dataclass_fields__)
    return value



@dataclass
class ShardProc:
    proc: subprocess.Popen[bytes]
    socket_path: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S, stale_inode: int | None = None) -> None:
        """Wait until the socket file appears (the launcher's readiness signal), replacing `stale_inode`."""
        deadline = time.monotonic() + timeout_s
        while not self.socket_path.exists() or self.socket_path.lstat().st_ino == stale_inode:
            if self.proc.poll() is not None:
                raise AssertionError(f"shard exited with {self.proc.returncode} before listening:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no socket at {self.socket_path} after {timeout_s} s:\n{self.log()}")
            time.sleep(0.05)

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"shard still running after {timeout_s} s:\n{self.log()}") from None

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def start_shard(
    model_dir: Path,
    uds_base: Path,
    log_path: Path,
    *,
    rank: int = 0,
    world_size: int = 1,
    master_port: int | None = None,
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> ShardProc:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    if master_port is not None:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
    # One torch thread per process: the tests run several shards on two cores.
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable, "-m", "tgictl", "--log-level", "debug", "shard",
        "--model-id", str(model_dir), "--uds-path", str(uds_base), "--dtype", "float32",
        "--block-size", str(BLOCK_SIZE), "--kv-cache-memory", str(KV_CACHE_MEMORY), *extra_args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    return ShardProc(proc, Path(f"{uds_base}-{rank}"), log_path)


class ShardConn:
    """grpc.aio stubs on one or more shard sockets (index = rank), driven synchronously from tests.

    One event loop serves every channel, so `all` can reach every tensor-parallel rank at once (a
    rank's forward waits in its collectives until every rank received the same RPC).
    """

    def __init__(self, *socket_paths: Path) -> None:
        self._runner = asyncio.Runner()
        self._channels = [self._runner.run(self._open(path)) for path in socket_paths]
        self.stubs = [TextGenerationServiceStub(channel) for channel in self._channels]

    @staticmethod
    async def _open(socket_path: Path) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"unix://{socket_path}")

    def call(self, method: str, request: Any, rank: int = 0, timeout_s: float = 60.0) -> Any:
        async def one() -> Any:
            return await getattr(self.stubs[rank], method)(request, timeout=timeout_s)

        return self._runner.run(one())

    def all(self, method: str, request: Any, timeout_s: float = 60.0) -> list[Any]:
        """The same call on every rank concurrently, as the router's ShardedClient does; answers by rank."""

        async def run_all() -> list[Any]:
            return list(await asyncio.gather(*(getattr(s, method)(request, timeout=timeout_s) for s in self.stubs)))

        return self._runner.run(run_all())

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a test's own coroutine (using `stubs`) on the channels' event loop."""
        return self._runner.run(coroutine)

    def status(self, method: str, request: Any, rank: int = 0) -> tuple[grpc.StatusCode, str]:
        """The status of a call that must fail."""
        try:
            self.call(method, request, rank)
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or ""
        raise AssertionError(f"{method} succeeded but was expected to fail")

    def close(self) -> None:
        for channel in self._channels:
            self._runner.run(channel.close())
        self._runner.close()


class Blocks:
    """Hands out fresh blocks from 1 upwards as the router would (block 0 is the health probe's)."""

    def __init__(self) -> None:
        self.next_block = 1

    def request(
        self,
        rid: int,
        prompt: tuple[int, ...],
        max_new_tokens: int,
        sampling: SamplingParams,
        **kwargs: Any,
    ) -> Request:
        tokens = len(prompt) + max_new_tokens - 1
        count = math.ceil(tokens / BLOCK_SIZE)
        blocks = tuple(range(self.next_block, self.next_block + count))
        self.next_block += count
        return Request(
            id=rid,
            input_ids=prompt,
            sampling=sampling,
            stopping=StoppingParams(max_new_tokens=max_new_tokens),
            blocks=blocks,
            **kwargs,
        )


def warmup_batch(prompt_len: int = 64) -> Batch:
    """The probe batch the router sends (TGI's grpc_client.rs `warmup`): no blocks, id 0, every processor on."""
    request = Request(
        id=0,
        input_ids=tuple(3 + i % 200 for i in range(prompt_len)),
        sampling=SamplingParams(temperature=0.5, top_k=10, top_p=0.5, repetition_penalty=1.25, seed=0),
        stopping=StoppingParams(max_new_tokens=1, ignore_eos=True),
        prefill_logprobs=True,
        top_n_tokens=5,
    )
    return Batch(id=0, requests=(request,))


def health_ok(conn: ShardConn, rank: int = 0) -> None:
    assert conn.call("Health", pb.HealthRequest(), rank) == pb.HealthResponse()
