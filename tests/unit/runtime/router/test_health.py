"""/health: the ranks' Health RPC; after a generation error, a real forward on block 0, never beside a step and
never waiting for one."""

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
    assert request.input_ids == (7,) and request.blocks == (0,)
    assert request.stopping.max_new_tokens == 1 and not request.sampling.samples


def test_cheap_check_then_probe_after_an_error() -> None:
    async def scenario() -> None:
        client = FakeServiceClient()
        checker = HealthChecker(client, probe_token_id=7)
        await checker.check()
        assert client.probes == []  # healthy: only the Health RPC
        checker.mark_unhealthy(GenerationError("boom"))
        client.probes_fail = True
        with pytest.raises(UnhealthyError):
            await checker.check()
        assert len(client.probes) == 1 and not checker.healthy
        client.probes_fail = False
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


class TimedClient(FakeServiceClient):
    """Records when each forward (steps and probes) runs on the 'shards'."""

    def __init__(self) -> None:
        super().__init__(step_delay_s=0.01)
        self.forwards: list[tuple[str, float, float]] = []

    async def prefill(self, batch, cached, max_prefill_tokens=None, grants=()):  # type: ignore[no-untyped-def]
        start = asyncio.get_running_loop().time()
        if batch.id == HEALTH_BATCH_ID:
            await asyncio.sleep(0.01)  # a real probe forward takes time too
        result = await super().prefill(batch, cached, max_prefill_tokens, grants)
        self.forwards.append(("probe" if batch.id == HEALTH_BATCH_ID else "step", start, asyncio.get_running_loop().time()))
        return result

    async def decode(self, batches, steps=1, grants=()):  # type: ignore[no-untyped-def]
        start = asyncio.get_running_loop().time()
        result = await super().decode(batches, steps, grants)
        self.forwards.append(("step", start, asyncio.get_running_loop().time()))
        return result


def test_the_probe_forward_never_runs_beside_a_batch_step(tiny_tokenizer_dir) -> None:  # type: ignore[no-untyped-def]
    """With several ranks, a probe Prefill sent while a Decode runs could reach the ranks in different
    orders and desynchronise their collectives: a probe runs only between steps (else the running loop
    itself proves the shards compute), and one runs once the loop is idle."""
    from tgictl.config import RouterConfig
    from tgictl.runtime.router.service import RouterService
    from tgictl.runtime.router.validation import GenerationInput

    async def scenario() -> list[tuple[str, float, float]]:
        client = TimedClient()
        # One step per Decode: 30 separate steps for the probes to fall between.
        config = RouterConfig(master_shard_uds_path="/tmp/x-0", tokenizer_name="m", decode_steps=1)
        service = await RouterService.start(config, tiny_tokenizer_dir, client, "tiny")
        try:
            admission = service.admit()
            validated = await service.validate(admission, GenerationInput(inputs="hello", max_new_tokens=30))
            consumer = asyncio.ensure_future(asyncio.gather(*[_drain(service.stream(admission, validated))]))
            for _ in range(8):
                service.health.mark_unhealthy(GenerationError("boom"))
                await service.check_health()
                await asyncio.sleep(0.004)
            await consumer
            admission.release()
            service.health.mark_unhealthy(GenerationError("boom"))
            await service.check_health()  # idle: the probe forward runs
            assert service.health.healthy
        finally:
            await service.close()
        return client.forwards

    forwards = asyncio.run(scenario())
    probes = [f for f in forwards if f[0] == "probe"]
    steps = [f for f in forwards if f[0] == "step"]
    assert 1 <= len(probes) <= 9 and len(steps) >= 30
    overlaps = [(p, s) for p in probes for s in steps if p[1] < s[2] and s[1] < p[2]]
    assert overlaps == []


async def _drain(stream) -> None:  # type: ignore[no-untyped-def]
    async for _ in stream:
        pass


def test_health_never_waits_for_a_step(tiny_tokenizer_dir) -> None:  # type: ignore[no-untyped-def]
    """A step that runs for as long as it likes (a long prefill): /health answers meanwhile, flagged or not,
    and never 503 while the ranks are alive."""
    from tgictl.config import RouterConfig
    from tgictl.runtime.router.service import RouterService
    from tgictl.runtime.router.validation import GenerationInput

    class BlockingClient(FakeServiceClient):
        def __init__(self) -> None:
            super().__init__()
            self.step_started = asyncio.Event()
            self.release = asyncio.Event()

        async def prefill(self, batch, cached, max_prefill_tokens=None, grants=()):  # type: ignore[no-untyped-def]
            if batch.id != HEALTH_BATCH_ID:
                self.step_started.set()
                await self.release.wait()
            return await super().prefill(batch, cached, max_prefill_tokens)

    async def scenario() -> None:
        client = BlockingClient()
        config = RouterConfig(master_shard_uds_path="/tmp/x-0", tokenizer_name="m")
        service = await RouterService.start(config, tiny_tokenizer_dir, client, "tiny")
        try:
            admission = service.admit()
            validated = await service.validate(admission, GenerationInput(inputs="hello", max_new_tokens=3))
            consumer = asyncio.ensure_future(_drain(service.stream(admission, validated)))
            await client.step_started.wait()
            await asyncio.wait_for(service.check_health(), timeout=5)
            service.health.mark_unhealthy(GenerationError("an earlier step failed"))
            await asyncio.wait_for(service.check_health(), timeout=5)  # no probe beside the step, no wait
            assert not client.release.is_set() and client.probes == []
            client.release.set()
            await consumer
            admission.release()
            await service.check_health()  # idle now: the probe forward runs and clears the flag
            assert len(client.probes) == 1 and service.health.healthy
        finally:
            await service.close()

    asyncio.run(scenario())
