"""Load shapes: seeded Poisson arrivals, closed-loop concurrency, request counts and durations."""

from __future__ import annotations

import asyncio
import math
import statistics
import time

import pytest

from tgictl.errors import ConfigError
from tgictl.runtime.bench.client import RequestRecord
from tgictl.runtime.bench.load_shapes import LoadPlan, poisson_arrivals, run_load


def test_poisson_arrivals_are_seeded_with_mean_gap_one_over_rate() -> None:
    times = poisson_arrivals(rate=4.0, seed=3, count=4000, duration_s=None)
    assert times == poisson_arrivals(rate=4.0, seed=3, count=4000, duration_s=None)
    assert times != poisson_arrivals(rate=4.0, seed=4, count=4000, duration_s=None)
    assert times[0] == 0.0 and times == sorted(times) and len(times) == 4000
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.05)
    # Exponential gaps: the standard deviation equals the mean.
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.08)


def test_poisson_arrivals_stop_before_the_duration() -> None:
    times = poisson_arrivals(rate=10.0, seed=0, count=None, duration_s=2.0)
    assert times[-1] < 2.0 and 10 < len(times) < 40
    assert poisson_arrivals(rate=10.0, seed=0, count=5, duration_s=2.0) == times[:5]
    with pytest.raises(ConfigError):
        poisson_arrivals(rate=1.0, seed=0, count=None, duration_s=None)


def test_a_plan_is_exactly_one_shape_with_an_end() -> None:
    with pytest.raises(ConfigError, match="either closed loop"):
        LoadPlan(concurrency=2, request_rate=1.0, num_requests=1)
    with pytest.raises(ConfigError, match="to end"):
        LoadPlan(concurrency=2)
    assert LoadPlan(concurrency=8, num_requests=1).label == "concurrency 8"
    assert LoadPlan(request_rate=2.5, duration_s=1).label == "rate 2.5/s"


class _Server:
    """Answers every request after `service_s`, tracking how many are in flight."""

    def __init__(self, service_s: float) -> None:
        self.service_s = service_s
        self.in_flight = 0
        self.peak = 0
        self.start = time.perf_counter()

    async def send(self, index: int) -> RequestRecord:
        sent = time.perf_counter()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.service_s)
        self.in_flight -= 1
        e2e = time.perf_counter() - sent
        return RequestRecord(index=index, group=None, start_s=sent - self.start, e2e_s=e2e, ttft_s=e2e,
                             output_tokens=1)


def test_closed_loop_keeps_concurrency_requests_in_flight() -> None:
    server = _Server(0.05)
    done: list[int] = []
    records, duration = asyncio.run(run_load(LoadPlan(concurrency=4, num_requests=12), server.send,
                                             lambda r: done.append(r.index)))
    assert [r.index for r in records] == list(range(12)) and sorted(done) == list(range(12))
    assert server.peak == 4
    assert duration == pytest.approx(3 * 0.05, abs=0.04)  # three waves of four


def test_closed_loop_with_a_duration_stops_issuing_then_drains() -> None:
    server = _Server(0.05)
    records, duration = asyncio.run(run_load(LoadPlan(concurrency=2, duration_s=0.22), server.send, lambda r: None))
    # Each client sends at 0, 0.05, 0.10, 0.15, 0.20 (< 0.22) and no more: 5 rounds of 2.
    assert len(records) == 10 and server.peak == 2
    assert 0.22 <= duration < 0.35


def test_open_loop_sends_on_the_poisson_schedule_whatever_the_server_does() -> None:
    server = _Server(0.2)  # slower than the gaps: requests pile up, as open loops allow
    plan = LoadPlan(request_rate=50.0, num_requests=10, seed=1)
    records, duration = asyncio.run(run_load(plan, server.send, lambda r: None))
    schedule = poisson_arrivals(50.0, 1, 10, None)
    starts = [r.start_s - records[0].start_s for r in records]
    assert all(math.isclose(s, t, abs_tol=0.03) for s, t in zip(starts, schedule))
    assert server.peak > 1
    assert duration == pytest.approx(schedule[-1] + 0.2, abs=0.05)
