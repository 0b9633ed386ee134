"""The simulation's fake shard: the cost model fitted to measured static batches recovers known
coefficients, and a router over it spends what the model says, less for a cached prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.runtime.router.test_service import run
from tgictl.proto.messages import SamplingParams
from tgictl.runtime.router.request import ValidatedRequest
from tgictl.runtime.router.service import RouterService
from tgictl.testing.fake_shard import FakeServiceClient
from tgictl.testing.timed_fake_shard import StepCost, TimedFakeClient

TRUE = StepCost(fixed_s=0.004, per_prefill_token_s=3e-4, per_decode_row_s=2e-4, per_cached_token_s=1e-6)


def test_the_fit_recovers_the_coefficients_of_exact_measurements() -> None:
    points = [{"sequence_length": length, "batch_size": batch,
               "prefill_s": TRUE.fixed_s + TRUE.per_prefill_token_s * batch * length,
               "decode_step_s": TRUE.seconds(0, batch, batch * length)}
              for length in (16, 512) for batch in (1, 8, 32)]
    fitted = StepCost.fit(points)
    for name in ("fixed_s", "per_prefill_token_s", "per_decode_row_s", "per_cached_token_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=1e-6, abs=1e-12), name
    assert StepCost.from_file(Path(__file__).resolve().parents[3] / "docs" / "replicas-simulation" /
                              "measured_steps.json").per_prefill_token_s > 0


def test_a_cached_prefix_costs_less_on_the_timed_shard(tiny_tokenizer_dir: Path) -> None:
    cost = StepCost(fixed_s=0.0, per_prefill_token_s=1e-3, per_decode_row_s=0.0, per_cached_token_s=0.0)
    fake = TimedFakeClient(cost=cost)

    async def body(service: RouterService, client: FakeServiceClient) -> None:
        prompt = tuple(range(1, 161))  # 160 tokens: 9 whole blocks can be cached, the last one is computed
        spent = []
        for _ in range(2):
            before = fake.busy_s
            request = ValidatedRequest(input_ids=prompt, sampling=SamplingParams(), max_new_tokens=1)
            admission = service.admit()
            try:
                async for _event in service.stream(admission, request):
                    pass
            finally:
                admission.release()
            spent.append(fake.busy_s - before)
        assert spent[0] == pytest.approx(0.160, abs=1e-9)  # every token computed
        assert spent[1] == pytest.approx(0.160 - 0.144, abs=1e-9)  # 144 cached tokens skipped

    run(tiny_tokenizer_dir, body, fake=fake)
