"""/health semantics (TGI's router/src/server.rs `health`, without its waits): every rank's Health RPC, answered from
the shard's state; after a generation error, also a real one-token forward on the reserved block 0 until one
succeeds, run only while no step is running (docs/architecture.md, "Health")."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from tgictl.errors import TgictlError, UnhealthyError
from tgictl.proto.messages import (
    Batch,
    CachedBatch,
    Request,
    SamplingParams,
    StepResult,
    StoppingParams,
)

log = logging.getLogger(__name__)

# The probe's ids never collide with the queue's, which count up from 0 (TGI uses u64::MAX too).
HEALTH_BATCH_ID = 2**64 - 1
HEALTH_REQUEST_ID = 2**64 - 1


class HealthClient(Protocol):
    async def health(self) -> None: ...

    async def prefill(self, batch: Batch, cached: CachedBatch | None) -> StepResult: ...

    async def clear_cache(self, batch_id: int | None) -> None: ...


def probe_batch(token_id: int) -> Batch:
    """One greedy one-token request writing its single KV entry into block 0, position 0
    (block 0 is never handed out by the allocators, docs/architecture.md, "Decisions": The router owns memory)."""
    request = Request(
        id=HEALTH_REQUEST_ID,
        input_ids=(token_id,),
        sampling=SamplingParams(),
        stopping=StoppingParams(max_new_tokens=1),
        blocks=(0,),
    )
    return Batch(id=HEALTH_BATCH_ID, requests=(request,), max_tokens=1, max_blocks=1)


class HealthChecker:
    def __init__(self, client: HealthClient, probe_token_id: int, forward_lock: asyncio.Lock | None = None) -> None:
        self._client = client
        self._probe_token_id = probe_token_id
        self._lock = asyncio.Lock()  # concurrent /health calls share one probe instead of piling up
        # The batcher holds it around every step: a probe forward sent while a step runs could reach
        # the ranks in different orders and desynchronise their collectives.
        self._forward_lock = forward_lock if forward_lock is not None else asyncio.Lock()
        self.healthy = True

    def mark_unhealthy(self, err: TgictlError) -> None:
        """Batcher on_error: the next /health runs a real forward."""
        self.healthy = False

    async def check(self) -> None:
        """Raise UnhealthyError unless every rank is alive and, after a failed step, the shards can compute.

        Never waits for a step (docs/architecture.md, "Health"): the ranks answer Health from their state,
        and the probe forward that follows a failed step runs only while the batching loop is idle. While
        it runs steps, the loop itself is the proof that the shards compute; a busy server is a healthy one.
        """
        async with self._lock:
            try:
                await self._client.health()
                if self.healthy or self._forward_lock.locked():
                    return
                async with self._forward_lock:  # free, so taken at once: no step is waited for
                    result = await self._client.prefill(probe_batch(self._probe_token_id), None)
                    if result.batch is not None:  # max_new_tokens=1 ends it, but never leave it behind
                        await self._client.clear_cache(HEALTH_BATCH_ID)
                if not result.generations:
                    raise UnhealthyError("unhealthy: the probe forward produced no token")
            except TgictlError as err:
                self.healthy = False
                log.warning("health check failed: %s", err)
                raise UnhealthyError("unhealthy") from None
            self.healthy = True
