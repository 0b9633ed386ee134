"""One run's figures from its request records: latency distributions, throughput, errors, goodput.

Only successful requests count towards latencies and tokens; failures count as errors (and as
misses in goodput). Throughput divides by the run's duration (first send to last answer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tgictl.runtime.bench.client import RequestRecord
from tgictl.runtime.bench.server_metrics import ServerFigures
from tgictl.runtime.bench.stats import Distribution, Goodput, goodput, rate


@dataclass(frozen=True)
class RunSummary:
    label: str
    duration_s: float
    requests: int
    succeeded: int
    failed: int
    prompt_tokens: int  # summed over successful requests (the server's counts where it gave them)
    output_tokens: int
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    ttft: Distribution
    itl: Distribution  # per token: each arrival's gap / the tokens it brought, over every request
    itl_burst: Distribution  # per burst: every gap between two arrivals of tokens
    tpot: Distribution  # one value per request with more than one token
    e2e: Distribution
    goodput: Goodput | None
    server: ServerFigures | None
    errors: dict[str, int]  # first 80 characters of each distinct error → how often

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "duration_s": self.duration_s, "requests": self.requests,
            "succeeded": self.succeeded, "failed": self.failed, "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens, "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.output_tokens_per_s, "total_tokens_per_s": self.total_tokens_per_s,
            "ttft_s": self.ttft.to_dict(), "itl_s": self.itl.to_dict(),
            "itl_burst_s": self.itl_burst.to_dict(), "tpot_s": self.tpot.to_dict(),
            "e2e_s": self.e2e.to_dict(),
            "goodput": None if self.goodput is None else {
                "good_requests": self.goodput.good_requests, "requests_per_s": self.goodput.requests_per_s,
                "fraction": self.goodput.fraction},
            "server": None if self.server is None else {
                **self.server.to_dict(), "engine_share": self.server.engine_share(self.duration_s)},
            "errors": self.errors,
        }


def summarize(label: str, records: Sequence[RequestRecord], duration_s: float, slo: Mapping[str, float],
              server: ServerFigures | None = None) -> RunSummary:
    ok = [r for r in records if r.ok]
    failed = len(records) - len(ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    errors: dict[str, int] = {}
    for record in records:
        if record.error is not None:
            key = record.error[:80]
            errors[key] = errors.get(key, 0) + 1
    return RunSummary(
        label=label,
        duration_s=duration_s,
        requests=len(records),
        succeeded=len(ok),
        failed=failed,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        requests_per_s=rate(len(ok), duration_s),
        output_tokens_per_s=rate(output_tokens, duration_s),
        total_tokens_per_s=rate(prompt_tokens + output_tokens, duration_s),
        ttft=Distribution.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl=Distribution.of([gap for r in ok for gap in r.itl_s]),
        itl_burst=Distribution.of([gap for r in ok for gap in r.itl_burst_s]),
        tpot=Distribution.of([t for t in (r.tpot_s for r in ok) if t is not None]),
        e2e=Distribution.of([r.e2e_s for r in ok if r.e2e_s is not None]),
        goodput=goodput([r.slo_figures() for r in ok], failed, slo, duration_s) if slo else None,
        server=server,
        errors=errors,
    )
