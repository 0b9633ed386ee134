"""Report rendering: tables carry the summary's figures; the JSON file never holds NaN."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console

from tgictl.runtime.bench.client import RequestRecord
from tgictl.runtime.bench.report import (
    json_safe,
    latency_table,
    throughput_table,
    write_json,
)
from tgictl.runtime.bench.server_metrics import ServerFigures
from tgictl.runtime.bench.summary import summarize


def _render(*tables: object) -> str:
    console = Console(record=True, width=200)
    console.print(*tables)
    return console.export_text()


def test_tables_show_the_figures() -> None:
    record = RequestRecord(index=0, group=None, prompt_tokens=10, output_tokens=3, ttft_s=0.1, e2e_s=0.5,
                           token_times=[0.1, 0.3, 0.5])
    server = ServerFigures(10, 5, 0.5, 100, 20, 0.2, 3)
    summary = summarize("concurrency 4", [record], duration_s=0.5, slo={"ttft": 0.2}, server=server)
    text = _render(throughput_table([summary]), latency_table(summary))
    assert "concurrency 4" in text
    assert "│ requests/s                       │          2.00 │" in text
    assert "│ total tokens/s                   │          26.0 │" in text  # (10 + 3) / 0.5
    assert "prefix-cache hit % (tokens)      │          50.0" in text
    assert "time to first token            │ 100.0 │ 100.0 │ 100.0 │ 100.0" in text
    assert "time per output token          │ 200.0" in text  # (0.5 - 0.1) / 2
    assert "inter-token latency, per token │" in text and "inter-token latency, per burst │" in text
    assert "per burst: time between arrivals of tokens" in text  # the caption says which is which


def test_an_empty_run_renders_dashes_and_writes_nulls(tmp_path: Path) -> None:
    failed = RequestRecord(index=0, group=None, error="HTTP 503: draining")
    summary = summarize("rate 2/s", [failed], duration_s=0.0, slo={})
    assert "│ requests/s                       │        - │" in _render(throughput_table([summary]))
    path = tmp_path / "out" / "r.json"
    write_json(path, {"summary": summary.to_dict(), "x": [math.nan, math.inf, 1.5]})
    document = json.loads(path.read_text())
    assert document["x"] == [None, None, 1.5] and document["summary"]["requests_per_s"] is None
    assert json_safe({"a": (1.0, float("nan"))}) == {"a": [1.0, None]}
