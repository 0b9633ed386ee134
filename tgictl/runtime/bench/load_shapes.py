"""Load shapes of `tgictl bench`: a closed loop (N clients, each sending its next request as soon as
the last one finished) or an open loop (Poisson arrivals at a fixed rate, whatever the server's pace).

A run stops issuing requests after `num_requests` or once `duration_s` has passed, then waits for the
ones in flight; its duration runs from the first send to the last answer.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tgictl.errors import ConfigError
from tgictl.runtime.bench.client import RequestRecord

SendFn = Callable[[int], Awaitable[RequestRecord]]
DoneFn = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class LoadPlan:
    """One run: exactly one of `concurrency` (closed loop) and `request_rate` (open loop)."""

    concurrency: int | None = None
    request_rate: float | None = None
    num_requests: int | None = None
    duration_s: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.request_rate is None):
            raise ConfigError("a run is either closed loop (concurrency) or open loop (request_rate)")
        if self.num_requests is None and self.duration_s is None:
            raise ConfigError("a run needs num_requests or duration_s to end")

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency is not None else f"rate {self.request_rate:g}/s"


def poisson_arrivals(rate: float, seed: int, count: int | None, duration_s: float | None) -> list[float]:
    """Send times (seconds from the start) of a Poisson process: the first at 0, then exponential gaps
    of mean 1/rate from a seeded generator. Ends at `count` arrivals or before `duration_s`."""
    if count is None and duration_s is None:
        raise ConfigError("poisson_arrivals needs a count or a duration")
    rng = random.Random(seed)
    times: list[float] = []
    t = 0.0
    while (count is None or len(times) < count) and (duration_s is None or t < duration_s):
        times.append(t)
        t += rng.expovariate(rate)
    return times


async def _closed_loop(plan: LoadPlan, send: SendFn, done: DoneFn, start: float) -> list[RequestRecord]:
    assert plan.concurrency is not None  # LoadPlan guarantees it
    records: list[RequestRecord] = []
    indices = itertools.count()

    async def client() -> None:
        while True:
            if plan.duration_s is not None and time.perf_counter() - start >= plan.duration_s:
                return
            index = next(indices)
            if plan.num_requests is not None and index >= plan.num_requests:
                return
            record = await send(index)
            records.append(record)
            done(record)

    await asyncio.gather(*(client() for _ in range(plan.concurrency)))
    return records


async def _open_loop(plan: LoadPlan, send: SendFn, done: DoneFn, start: float) -> list[RequestRecord]:
    assert plan.request_rate is not None
    records: list[RequestRecord] = []

    async def one(index: int) -> None:
        record = await send(index)
        records.append(record)
        done(record)

    tasks = []
    for index, at in enumerate(poisson_arrivals(plan.request_rate, plan.seed, plan.num_requests, plan.duration_s)):
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(index)))
    await asyncio.gather(*tasks)
    return records


async def run_load(plan: LoadPlan, send: SendFn, done: DoneFn) -> tuple[list[RequestRecord], float]:
    """Records sorted by index, and the run's duration in seconds (first send to last answer)."""
    start = time.perf_counter()
    loop = _closed_loop if plan.concurrency is not None else _open_loop
    records = await loop(plan, send, done, start)
    records.sort(key=lambda r: r.index)
    if not records:
        return records, 0.0
    first = min(r.start_s for r in records)
    last = max(r.start_s + (r.e2e_s or 0.0) for r in records)
    return records, last - first
