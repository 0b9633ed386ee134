"""A FakeShard that also answers start-up and health calls, so a RouterService (and its HTTP app) runs
in-process without a model: the tokens are FakeShard's arithmetic, everything else is real."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from tgictl.errors import GenerationError
from tgictl.proto.messages import Batch, CachedBatch, Info, StepResult, WarmupRequest, WarmupResult
from tgictl.testing.fake_shard import FakeShard


def fake_info(block_size: int = 16, prefix_caching: bool = True, chunking: bool = True) -> Info:
    return Info(
        dtype="float32", device_type="cpu", block_size=block_size, support_chunking=chunking,
        use_prefix_caching=prefix_caching, attention_impl="reference", model_type="llama", vocab_size=512,
        num_layers=2, max_position_embeddings=2048, eos_token_ids=(2,), world_size=1,
    )


@dataclass
class FakeServiceClient:
    """FakeShard plus Info / Warmup / Health / close, recording what the router asked."""

    shard: FakeShard = field(default_factory=lambda: FakeShard(first_token=40, span=200))
    info_reply: Info = field(default_factory=fake_info)
    supported_tokens: int = 4096
    step_delay_s: float = 0.0  # slows every Prefill/Decode, so tests can act mid-generation
    healthy: bool = True
    warmups: list[WarmupRequest] = field(default_factory=list)
    probes: list[Batch] = field(default_factory=list)
    closed: bool = False

    async def info(self) -> Info:
        return self.info_reply

    async def warmup(self, request: WarmupRequest) -> WarmupResult:
        self.warmups.append(request)
        total = request.max_total_tokens or min(self.supported_tokens, 2048)
        return WarmupResult(self.supported_tokens, request.max_input_tokens or total - 1, total)

    async def health(self) -> None:
        if not self.healthy:
            raise GenerationError("shard unhealthy")

    async def prefill(self, batch: Batch, cached: CachedBatch | None) -> StepResult:
        if batch.id == 2**64 - 1:  # the health probe
            self.probes.append(batch)
            if not self.healthy:
                raise GenerationError("probe failed")
            return await self.shard.prefill(batch, None)
        await asyncio.sleep(self.step_delay_s)
        return await self.shard.prefill(batch, cached)

    async def decode(self, batches: Sequence[CachedBatch]) -> StepResult:
        await asyncio.sleep(self.step_delay_s)
        return await self.shard.decode(batches)

    async def filter_batch(self, batch_id: int, request_ids: Sequence[int]) -> CachedBatch:
        return await self.shard.filter_batch(batch_id, request_ids)

    async def clear_cache(self, batch_id: int | None) -> None:
        await self.shard.clear_cache(batch_id)

    async def close(self) -> None:
        self.closed = True
