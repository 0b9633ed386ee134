"""A fake shard whose steps take as long as the real engine's would (scripts/simulate_replicas.py;
docs/replicas.md, "Simulation"): FakeServiceClient's batch bookkeeping and tokens, plus a sleep per
Prefill/Decode from a cost model fitted to `tgictl bench --shard` measurements of the real shard:

    step = fixed + per_prefill_token · tokens computed + per_decode_row · rows decoding
           + per_cached_token · tokens those rows attend to

so prefix caching pays as it does for real (a cached prefix is not computed), and a replica's batch
slows as it fills. Sleeping, not computing: many replicas share one host's cores in a simulation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tgictl.proto.messages import Batch, BlockGrant, CachedBatch, StepResult
from tgictl.testing.fake_shard import FakeServiceClient


@dataclass(frozen=True)
class StepCost:
    fixed_s: float
    per_prefill_token_s: float
    per_decode_row_s: float
    per_cached_token_s: float

    def seconds(self, prefill_tokens: int, decode_rows: int, cached_tokens: int) -> float:
        return max(0.0, self.fixed_s + self.per_prefill_token_s * prefill_tokens
                   + self.per_decode_row_s * decode_rows + self.per_cached_token_s * cached_tokens)

    def scaled(self, factor: float) -> StepCost:
        return StepCost(*(value * factor for value in (self.fixed_s, self.per_prefill_token_s,
                                                       self.per_decode_row_s, self.per_cached_token_s)))

    @classmethod
    def fit(cls, points: Sequence[dict[str, float]]) -> StepCost:
        """Least squares over measured static batches: {"sequence_length", "batch_size", "prefill_s",
        "decode_step_s"} each (a prefill computes batch · length tokens; a decode step has batch rows
        attending to about `length` tokens each). Negative slopes (noise) are clipped to 0."""
        b = np.array([p["batch_size"] for p in points], dtype=float)
        length = np.array([p["sequence_length"] for p in points], dtype=float)
        prefill = np.linalg.lstsq(np.stack([np.ones_like(b), b * length], axis=1),
                                  np.array([p["prefill_s"] for p in points]), rcond=None)[0]
        decode = np.linalg.lstsq(np.stack([np.ones_like(b), b, b * length], axis=1),
                                 np.array([p["decode_step_s"] for p in points]), rcond=None)[0]
        return cls(fixed_s=max(float(decode[0]), 0.0), per_prefill_token_s=max(float(prefill[1]), 0.0),
                   per_decode_row_s=max(float(decode[1]), 0.0), per_cached_token_s=max(float(decode[2]), 0.0))

    @classmethod
    def from_file(cls, path: Path) -> StepCost:
        return cls.fit(json.loads(path.read_text())["points"])


@dataclass
class TimedFakeClient(FakeServiceClient):
    cost: StepCost = field(default_factory=lambda: StepCost(0.0, 0.0, 0.0, 0.0))
    busy_s: float = 0.0  # the time this shard spent in steps

    def _decoding(self, batch_ids: Sequence[int]) -> tuple[int, int]:
        lives = [live for batch_id in batch_ids for live in self.shard.batches.get(batch_id, [])]
        return len(lives), sum(len(live.request.input_ids) + live.generated for live in lives)

    async def _spend(self, seconds: float) -> None:
        self.busy_s += seconds
        await asyncio.sleep(seconds)

    async def prefill(
        self, batch: Batch, cached: CachedBatch | None, max_prefill_tokens: int | None = None,
        grants: Sequence[BlockGrant] = (),
    ) -> StepResult:
        if batch.id != 2**64 - 1:  # not the health probe
            computed = sum(r.chunk_len or len(r.input_ids) - r.cache_len for r in batch.requests)
            rows, context = self._decoding([cached.id] if cached is not None else [])
            await self._spend(self.cost.seconds(computed, rows, context))
        return await super().prefill(batch, cached, max_prefill_tokens, grants)

    async def decode(
        self, batches: Sequence[CachedBatch], steps: int = 1, grants: Sequence[BlockGrant] = ()
    ) -> StepResult:
        rows, context = self._decoding([b.id for b in batches])
        await self._spend(steps * self.cost.seconds(0, rows, context))
        return await super().decode(batches, steps, grants)
