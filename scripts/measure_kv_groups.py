"""Peak live KV blocks per layer group (tgictl/kv_groups.py) of long generations on a tiny Gemma 3 (5 local : 1 global
layers, a sliding window of 64, blocks of 16), with the local blocks behind the window released and without: one shard
process, the router's batcher and radix allocator as `tgictl router` runs them, the allocator sampled at every Decode.
Also checks that both runs generate the same greedy tokens.

    python scripts/measure_kv_groups.py [--prompt 100] [--new-tokens 900] [--requests 1] [--window 64]

Counts of blocks, not timings: the shared machine does not change them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from tgictl.kv_groups import KvGroups, hybrid_window
from tgictl.proto.messages import (
    Batch, BlockGrant, CachedBatch, Request, SamplingParams, StepResult, StoppingParams, WarmupRequest,
)
from tgictl.runtime.router.kv.prefix_allocator import RadixAllocator
from tgictl.runtime.router.request import EndEvent, TokenEvent, ValidatedRequest
from tgictl.runtime.router.scheduling.batcher import Batcher, BatcherConfig
from tgictl.runtime.router.scheduling.entry import TokenTexts
from tgictl.runtime.router.scheduling.event_channel import events
from tgictl.runtime.router.scheduling.queue import Queue
from tgictl.runtime.router.shard_client import ShardedClient
from tgictl.testing.tiny_models import write_tiny_model

BLOCK_SIZE = 16


class SampledClient:
    """The shard client, recording each group's live blocks before every Decode."""

    def __init__(self, inner: ShardedClient, allocator: RadixAllocator) -> None:
        self.inner, self.allocator = inner, allocator
        self.global_used: list[int] = []
        self.local_used: list[int] = []

    async def prefill(self, batch: Batch, cached: CachedBatch | None, max_prefill_tokens: int | None = None,
                      grants: Sequence[BlockGrant] = ()) -> StepResult:
        return await self.inner.prefill(batch, cached, max_prefill_tokens, grants)

    async def decode(self, batches: Sequence[CachedBatch], steps: int = 1,
                     grants: Sequence[BlockGrant] = ()) -> StepResult:
        allocator = self.allocator
        assert allocator.groups is not None and allocator.local_free_blocks is not None
        self.global_used.append(allocator.used_blocks)
        self.local_used.append(allocator.groups.local_blocks - 1 - allocator.local_free_blocks)
        return await self.inner.decode(batches, steps, grants)

    async def filter_batch(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch:
        return await self.inner.filter_batch(batch_id, request_ids)

    async def clear_cache(self, batch_id: int | None) -> None:
        await self.inner.clear_cache(batch_id)


async def measure(socket: Path, model_dir: Path, args: argparse.Namespace, release: bool) -> tuple:
    inner = await ShardedClient.connect(str(socket))
    try:
        await inner.clear_cache(None)
        probe = Request(id=0, input_ids=(5,) * 32, sampling=SamplingParams(),
                        stopping=StoppingParams(max_new_tokens=1, ignore_eos=True))
        warm = await inner.warmup(WarmupRequest(batch=Batch(id=0, requests=(probe,)), max_prefill_tokens=512))
        window = hybrid_window((await inner.info()).layer_windows)
        assert warm.local_blocks and window is not None, "the shard keeps one KV group for this model"
        groups = KvGroups(warm.max_supported_total_tokens // BLOCK_SIZE, warm.local_blocks, window)
        allocator = RadixAllocator(groups.global_blocks, BLOCK_SIZE, groups=groups)
        client = SampledClient(inner, allocator)
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        batcher = Batcher(client, Queue(allocator, block_size=BLOCK_SIZE), allocator, TokenTexts(tokenizer, frozenset()),
                          BatcherConfig(max_batch_prefill_tokens=512, decode_steps=4,
                                        release_window=window if release else None))
        task = asyncio.create_task(batcher.run())
        try:
            async def one(i: int) -> list[int]:
                prompt = tuple(5 + (i * 13 + j * 7) % 300 for j in range(args.prompt))
                request = ValidatedRequest(input_ids=prompt, sampling=SamplingParams(), max_new_tokens=args.new_tokens,
                                           ignore_eos=True)
                got = [e async for e in events(batcher.submit([request]))]
                return [e.token.id for e in got if isinstance(e, (TokenEvent, EndEvent))]

            outputs = await asyncio.gather(*(one(i) for i in range(args.requests)))
        finally:
            task.cancel()
        allocator.check_integrity()
        preemptions = batcher.scheduler.preemptions
        return max(client.global_used), max(client.local_used), list(outputs), groups, preemptions
    finally:
        await inner.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=900)
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--window", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_tiny_model(Path(tmp) / "gemma3", "gemma3_text", num_layers=6, sliding_window_pattern=6,
                                     sliding_window=args.window)
        socket_base = Path(tmp) / "s"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": "0", "WORLD_SIZE": "1"}
        shard = subprocess.Popen(
            [sys.executable, "-m", "tgictl", "shard", "--model-id", str(model_dir), "--uds-path", str(socket_base),
             "--dtype", "float32", "--block-size", str(BLOCK_SIZE), "--kv-cache-memory", str(8 << 20)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            socket = Path(f"{socket_base}-0")
            for _ in range(600):
                if socket.exists():
                    break
                asyncio.run(asyncio.sleep(0.1))
            kept = asyncio.run(measure(socket, model_dir, args, release=False))
            released = asyncio.run(measure(socket, model_dir, args, release=True))
        finally:
            shard.terminate()
            shard.wait()
    total = args.prompt + args.new_tokens
    print(f"tiny Gemma 3 (6 layers: 5 local with a window of {args.window}, 1 global), blocks of {BLOCK_SIZE}, "
          f"{args.requests} request(s) of {args.prompt} prompt + {args.new_tokens} new tokens ({total} positions)")
    groups = kept[3]
    print(f"  the shard's groups (--kv-cache-memory 8 MiB): {groups.global_blocks - 1} global and "
          f"{groups.local_blocks - 1} local usable blocks")
    print(f"  peak live blocks without release: global {kept[0]}, local {kept[1]} ({kept[4]} preemptions)")
    print(f"  peak live blocks with release:    global {released[0]}, local {released[1]} ({released[4]} preemptions)")
    print(f"  same greedy tokens: {kept[2] == released[2]}")


if __name__ == "__main__":
    main()
