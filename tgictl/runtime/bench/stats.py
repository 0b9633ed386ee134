"""The arithmetic of `tgictl bench`: percentiles, latency summaries, SLOs, goodput and the all-decoding window.

Pure functions on plain numbers (no numpy, no I/O), so every figure the report prints can be checked
by hand in a unit test. Times are seconds throughout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tgictl.errors import ConfigError

# The SLO keys `--slo` accepts, each bounding one per-request figure (seconds).
SLO_KEYS: tuple[str, ...] = ("ttft", "tpot", "e2e")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) with linear interpolation between closest ranks.

    This is numpy's default ("linear", Hyndman & Fan type 7): rank r = q/100 * (n - 1) over the sorted
    values, interpolated between floor(r) and ceil(r). NaN for an empty sequence, so a run without a
    single decoded token still reports (instead of raising in the middle of a sweep).
    """
    if not 0.0 <= q <= 100.0:
        raise ConfigError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = q / 100.0 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    fraction = rank - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


@dataclass(frozen=True)
class Distribution:
    """Mean and the percentiles the report shows for one latency figure (NaN when no sample)."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        mean = math.fsum(values) / len(values) if values else math.nan
        return cls(len(values), mean, percentile(values, 50), percentile(values, 90), percentile(values, 99))

    def to_dict(self) -> dict[str, float | int | None]:
        # JSON has no NaN: an empty distribution is written as nulls.
        def clean(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {"count": self.count, "mean": clean(self.mean), "p50": clean(self.p50), "p90": clean(self.p90),
                "p99": clean(self.p99)}


def _arrivals(token_times: Sequence[float]) -> list[tuple[float, int]]:
    """(time, tokens) per arrival: the tokens of one network read share its time (client.py)."""
    arrivals: list[tuple[float, int]] = []
    for t in token_times:
        if arrivals and arrivals[-1][0] == t:
            arrivals[-1] = (t, arrivals[-1][1] + 1)
        else:
            arrivals.append((t, 1))
    return arrivals


def burst_latencies(token_times: Sequence[float]) -> list[float]:
    """Inter-token latency per burst: the gaps between consecutive arrivals of tokens. A server that
    decodes several steps per call (multi-step decode) sends its tokens in bursts; this is the wait a
    reader sees between them."""
    arrivals = _arrivals(token_times)
    return [b[0] - a[0] for a, b in zip(arrivals, arrivals[1:])]


def inter_token_latencies(token_times: Sequence[float]) -> list[float]:
    """Inter-token latency per token: each arrival's gap spread over the tokens it brought, one value
    per token after the first arrival (gaps of 0 inside a burst would say nothing of the pace)."""
    arrivals = _arrivals(token_times)
    return [(b[0] - a[0]) / b[1] for a, b in zip(arrivals, arrivals[1:]) for _ in range(b[1])]


def time_per_output_token(ttft: float, e2e: float, output_tokens: int) -> float | None:
    """TPOT: the decode time spread over the tokens after the first, (e2e - ttft) / (n - 1).

    None for n <= 1: a request with a single token has no decode phase to measure.
    """
    if output_tokens <= 1:
        return None
    return (e2e - ttft) / (output_tokens - 1)


@dataclass(frozen=True)
class DecodeWindow:
    """The span in which every stream of a concurrent load was decoding: after the last first token,
    before the first stream's last token. Only there does a step carry all the rows, so the tokens
    that arrived inside it over its length is the server's decode rate at that batch (and context)."""

    start_s: float
    end_s: float
    tokens: int  # tokens that arrived after start_s, up to and including end_s

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def tok_s(self) -> float:
        """NaN when the window is empty (a stream ended before the last one began decoding)."""
        return self.tokens / self.length_s if self.length_s > 0 and self.tokens else math.nan


def all_decoding_window(streams: Sequence[Sequence[float]]) -> DecodeWindow:
    """The DecodeWindow of `streams`, each one stream's token arrival times on one clock (ascending).

    The first tokens themselves (ends of prefills) are not decode steps; the start is the last of them,
    so a token counts when it arrived strictly after it. A stream without tokens has no window.
    """
    if not streams or any(not times for times in streams):
        raise ConfigError("every stream needs at least one token to bound the decode window")
    start = max(times[0] for times in streams)
    end = min(times[-1] for times in streams)
    if end <= start:
        return DecodeWindow(start, start, 0)
    tokens = sum(1 for times in streams for t in times if start < t <= end)
    return DecodeWindow(start, end, tokens)


def parse_slo(text: str) -> dict[str, float]:
    """`ttft=0.5,tpot=0.05` → {"ttft": 0.5, "tpot": 0.05}; keys from SLO_KEYS, values seconds > 0."""
    slo: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise ConfigError(f"--slo entries must be KEY=SECONDS with KEY one of {', '.join(SLO_KEYS)}, got {item!r}")
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"--slo {key} must be a number of seconds, got {raw.strip()!r}") from None
        if not value > 0 or math.isinf(value):
            raise ConfigError(f"--slo {key} must be > 0 seconds, got {raw.strip()!r}")
        if key in slo:
            raise ConfigError(f"--slo gives {key} twice")
        slo[key] = value
    if not slo:
        raise ConfigError(f"--slo needs at least one of {', '.join(SLO_KEYS)}, got {text!r}")
    return slo


def meets_slo(figures: Mapping[str, float | None], slo: Mapping[str, float]) -> bool:
    """Whether one successful request meets every bound. A figure the request does not have (TPOT of
    a one-token answer) cannot break its bound."""
    for key, bound in slo.items():
        value = figures.get(key)
        if value is not None and value > bound:
            return False
    return True


@dataclass(frozen=True)
class Goodput:
    """Requests that succeeded within every SLO, as a count, a rate over the run and a share of all."""

    good_requests: int
    requests_per_s: float
    fraction: float  # of every request sent in the run (failures count as missed)


def goodput(request_figures: Sequence[Mapping[str, float | None]], failed: int, slo: Mapping[str, float],
            duration_s: float) -> Goodput:
    """`request_figures`: one mapping (ttft, tpot, e2e) per successful request."""
    good = sum(1 for figures in request_figures if meets_slo(figures, slo))
    total = len(request_figures) + failed
    rate = good / duration_s if duration_s > 0 else math.nan
    return Goodput(good, rate, good / total if total else math.nan)


def rate(count: float, duration_s: float) -> float:
    """count per second; NaN when the run took no measurable time."""
    return count / duration_s if duration_s > 0 else math.nan
