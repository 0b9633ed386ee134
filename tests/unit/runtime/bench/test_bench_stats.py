"""bench_stats and bench_summary: every figure checked against values computed by hand."""

from __future__ import annotations

import math

import pytest

from tgictl.errors import ConfigError
from tgictl.runtime.bench.client import RequestRecord
from tgictl.runtime.bench.stats import (
    Distribution,
    all_decoding_window,
    burst_latencies,
    goodput,
    inter_token_latencies,
    meets_slo,
    parse_slo,
    percentile,
    time_per_output_token,
)
from tgictl.runtime.bench.summary import summarize


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),  # rank 1.5: halfway between 2 and 3
        ([1.0, 2.0, 3.0, 4.0], 90, 3.7),  # rank 2.7: 3 + 0.7 * (4 - 3)
        ([1.0, 2.0, 3.0, 4.0], 99, 3.97),  # rank 2.97
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([20.0, 0.0, 10.0], 25, 5.0),  # unsorted input; rank 0.5 over [0, 10, 20]
        ([7.0], 99, 7.0),
        ([0.010, 0.020, 0.030, 0.040, 0.100], 90, 0.076),  # rank 3.6: 0.04 + 0.6 * 0.06
    ],
)
def test_percentile_interpolates_between_closest_ranks(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected, abs=1e-12)


def test_percentile_of_nothing_is_nan_and_q_is_checked() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ConfigError, match="percentile must be in"):
        percentile([1.0], 101)


def test_distribution_and_its_json_form() -> None:
    dist = Distribution.of([0.4, 0.1, 0.3, 0.2])
    assert (dist.count, dist.mean, dist.p50) == (4, pytest.approx(0.25), pytest.approx(0.25))
    assert dist.p90 == pytest.approx(0.37) and dist.p99 == pytest.approx(0.397)
    assert Distribution.of([]).to_dict() == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}


def test_token_timing_figures() -> None:
    assert inter_token_latencies([0.5, 0.6, 0.8, 1.4]) == pytest.approx([0.1, 0.2, 0.6])
    assert inter_token_latencies([0.5]) == []


def test_tokens_that_arrive_together_are_one_burst() -> None:
    """Multi-step decode: 1 token, then 3 in one read 0.3 s later, then 2 in one read 0.2 s after that."""
    times = [0.5, 0.8, 0.8, 0.8, 1.0, 1.0]
    assert burst_latencies(times) == pytest.approx([0.3, 0.2])
    assert inter_token_latencies(times) == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])  # 0.3 / 3, 0.2 / 2
    assert burst_latencies([0.5, 0.5]) == [] == inter_token_latencies([0.5, 0.5])  # one read: no gap
    assert time_per_output_token(ttft=0.5, e2e=1.4, output_tokens=10) == pytest.approx(0.1)  # 0.9 s / 9
    assert time_per_output_token(ttft=0.5, e2e=0.5, output_tokens=1) is None


def test_parse_slo() -> None:
    assert parse_slo("ttft=0.5,tpot=0.05") == {"ttft": 0.5, "tpot": 0.05}
    assert parse_slo(" E2E = 2 ,") == {"e2e": 2.0}
    for bad, message in (("ttft", "KEY=SECONDS"), ("itl=1", "KEY=SECONDS"), ("ttft=x", "number of seconds"),
                         ("ttft=0", "> 0 seconds"), ("ttft=1,ttft=2", "twice"), ("", "at least one")):
        with pytest.raises(ConfigError, match=message):
            parse_slo(bad)


def test_goodput_counts_requests_within_every_bound() -> None:
    slo = {"ttft": 0.5, "tpot": 0.05}
    figures = [
        {"ttft": 0.2, "tpot": 0.04, "e2e": 1.0},  # good
        {"ttft": 0.6, "tpot": 0.01, "e2e": 1.0},  # ttft too slow
        {"ttft": 0.3, "tpot": None, "e2e": 0.3},  # one token: no TPOT to break the bound -> good
        {"ttft": 0.5, "tpot": 0.051, "e2e": 1.0},  # ttft exactly at the bound is fine, tpot is not
    ]
    assert [meets_slo(f, slo) for f in figures] == [True, False, True, False]
    result = goodput(figures, failed=1, slo=slo, duration_s=2.0)
    assert result.good_requests == 2
    assert result.requests_per_s == pytest.approx(1.0)  # 2 good requests / 2 s
    assert result.fraction == pytest.approx(2 / 5)  # the failed request counts as a miss


def _record(index: int, ttft: float, e2e: float, times: list[float], prompt: int,
            error: str | None = None) -> RequestRecord:
    return RequestRecord(index=index, group=None, prompt_tokens=prompt, output_tokens=len(times), ttft_s=ttft,
                         e2e_s=e2e, token_times=times, error=error)


def test_summarize_a_run_by_hand() -> None:
    records = [
        _record(0, ttft=0.1, e2e=0.4, times=[0.1, 0.2, 0.4], prompt=10),  # tpot (0.4-0.1)/2 = 0.15
        _record(1, ttft=0.3, e2e=0.5, times=[0.3, 0.5], prompt=20),  # tpot 0.2
        _record(2, ttft=0.0, e2e=0.0, times=[], prompt=99, error="HTTP 429: overloaded"),
    ]
    s = summarize("c2", records, duration_s=2.0, slo={"tpot": 0.16})
    assert (s.requests, s.succeeded, s.failed) == (3, 2, 1)
    assert (s.prompt_tokens, s.output_tokens) == (30, 5)  # the failed request's tokens are not counted
    assert s.requests_per_s == pytest.approx(1.0)
    assert s.output_tokens_per_s == pytest.approx(2.5)
    assert s.total_tokens_per_s == pytest.approx(17.5)  # (30 + 5) / 2
    assert s.ttft.mean == pytest.approx(0.2) and s.e2e.p50 == pytest.approx(0.45)
    assert s.itl.count == 3 and s.itl.mean == pytest.approx((0.1 + 0.2 + 0.2) / 3)
    assert s.tpot.count == 2 and s.tpot.mean == pytest.approx(0.175)
    assert s.goodput is not None and s.goodput.good_requests == 1 and s.goodput.fraction == pytest.approx(1 / 3)
    assert s.errors == {"HTTP 429: overloaded": 1}
    assert s.to_dict()["goodput"]["requests_per_s"] == pytest.approx(0.5)


def test_decode_window_spans_last_first_token_to_first_end() -> None:
    # stream a's prefill ends at 1.0 and it decodes alone until b's first token at 3.0; b ends first, at 5.0
    a = [1.0, 2.0, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0]
    b = [3.0, 4.0, 5.0]
    window = all_decoding_window([a, b])
    assert (window.start_s, window.end_s, window.length_s) == (3.0, 5.0, 2.0)
    # after 3.0 up to 5.0: a's 3.5, 4.0, 4.5, 5.0 and b's 4.0, 5.0 (the first tokens at 3.0 are prefill's)
    assert window.tokens == 6
    assert window.tok_s == pytest.approx(3.0)


def test_decode_window_is_empty_when_a_stream_ends_before_the_last_begins() -> None:
    window = all_decoding_window([[1.0, 2.0], [3.0, 4.0]])
    assert (window.length_s, window.tokens) == (0.0, 0)
    assert math.isnan(window.tok_s)


def test_decode_window_needs_a_token_in_every_stream() -> None:
    with pytest.raises(ConfigError, match="at least one token"):
        all_decoding_window([[1.0], []])
    with pytest.raises(ConfigError, match="at least one token"):
        all_decoding_window([])
