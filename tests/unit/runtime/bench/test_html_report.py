"""The bench's HTML page from a document: self-contained, one chart per figure, values where they
belong, empty runs drawn as 'no data' rather than failing."""

from __future__ import annotations

import re

import pytest

from tgictl.runtime.bench.html_report import render_report
from tgictl.runtime.bench.svg_charts import Series, _ticks, histogram, line_chart


def dist(p50: float | None) -> dict[str, float | None]:
    return {"count": 1, "mean": p50, "p50": p50, "p90": p50, "p99": p50}


def run(concurrency: int, tokens_per_s: float, ttft: float | None, requests: list[dict[str, object]]) -> dict:
    summary = {"label": f"concurrency {concurrency}", "succeeded": len(requests), "failed": 0,
               "requests_per_s": 1.0, "output_tokens_per_s": tokens_per_s, "total_tokens_per_s": 2 * tokens_per_s,
               "ttft_s": dist(ttft), "itl_s": dist(ttft), "tpot_s": dist(ttft), "e2e_s": dist(ttft)}
    return {"plan": {"concurrency": concurrency, "request_rate": None}, "summary": summary, "requests": requests}


def test_report_is_one_page_with_every_chart_and_the_servers_info() -> None:
    records = [{"error": None, "ttft_s": 0.1 * i, "itl_s": [0.01, 0.02]} for i in range(1, 6)]
    document = {"tgictl_version": "9", "config": {"url": "http://h:1", "api": "tgi", "seed": 0},
                "server_info": {"model_id": "m", "max_total_tokens": 512},
                "runs": [run(1, 10.0, 0.1, records), run(8, 55.5, None, [])]}
    html = render_report(document)
    assert html.count("<svg") == 5 + 2 * 2
    assert "<script" not in html and "src=" not in html and "<link" not in html
    assert "<td>max_total_tokens</td><td>512</td>" in html and "<td>seed</td><td>0</td>" in html
    assert "55.5" in html  # a point's tooltip
    assert html.count("no data") == 2  # the run without successes has no distributions
    assert re.search(r'<circle cx="[\d.]+" cy="[\d.]+" r="3.5"', html)


def test_line_chart_skips_missing_values_and_histogram_counts_everything() -> None:
    chart = line_chart("t", "x", "y", [1, 2, 3], [Series("a", (1.0, None, 3.0))])
    assert chart.count("<circle") == 2
    bars = histogram("h", "ms", [1.0] * 3 + [10.0], bins=3)
    heights = [float(h) for h in re.findall(r'<rect x="[^"]+" y="[^"]+" width="[^"]+" height="([\d.]+)"', bars)]
    assert len(heights) == 3 and heights[1] == 0.0 and heights[0] == pytest.approx(3 * heights[2], abs=0.2)


def test_ticks_are_round_and_cover_the_range() -> None:
    assert _ticks(0, 97) == [0, 20, 40, 60, 80, 100]
    assert _ticks(0, 2, whole=True) == [0, 1, 2]
