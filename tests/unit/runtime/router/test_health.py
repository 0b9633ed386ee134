"""/health: the cheap Health RPC while healthy; after a generation error, a real forward on block 0."""

from __future__ import annotations

import asyncio

import pytest

from tgictl.testing.fake_shard import FakeServiceClient
from tgictl.errors import GenerationError, UnhealthyError
from tgictl.runtime.router.health import HEALTH_BATCH_ID, HealthChecker, probe_batch


def test_probe_writes_only_reserved_block_zero() -> None:
    batch = probe_batch(7)
    (request,) = batch.requests
    assert batch.id == HEALTH_BATCH_ID == 2**64 - 1
    assert request.input_ids == (7,) and request.blocks == (0,) and request.slots == (0,)
    assert request.stopping.max_new_tokens == 1 and not request.sampling.samples


def test_cheap_check_then_probe_after_an_error() -> None:
    async def scenario() -> None:
        client = FakeServiceClient()
        checker = HealthChecker(client, probe_token_id=7)
        await checker.check()
        assert client.probes == []  # healthy: only the Health RPC
        checker.mark_unhealthy(GenerationError("boom"))
        client.healthy = False
        with pytest.raises(UnhealthyError):
            await checker.check()
        assert len(client.probes) == 1 and not checker.healthy
        client.healthy = True
        await checker.check()  # the probe forward succeeds: healthy again
        assert len(client.probes) == 2 and checker.healthy
        await checker.check()
        assert len(client.probes) == 2  # back to the cheap check
        assert client.shard.batches == {}  # the probe left nothing behind on the shard

    asyncio.run(scenario())


def test_failed_cheap_check_switches_to_probe() -> None:
    async def scenario() -> None:
        client = FakeServiceClient(healthy=False)
        checker = HealthChecker(client, probe_token_id=7)
        with pytest.raises(UnhealthyError, match="unhealthy"):
            await checker.check()
        assert client.probes == []
        client.healthy = True
        await checker.check()
        assert len(client.probes) == 1

    asyncio.run(scenario())
