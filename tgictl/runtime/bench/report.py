"""How `tgictl bench` shows results: a live progress bar per run, final rich tables, and the JSON file
(per-request records and summaries). Rendering only; the figures come from bench_summary/bench_shard."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from tgictl.errors import ConfigError
from tgictl.runtime.bench.stats import Distribution
from tgictl.runtime.bench.summary import RunSummary


def make_progress(console: Console) -> Progress:
    """Requests done (of the total when known), elapsed time, and a live status line per run."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"), console=console, transient=False,
    )


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1000:.1f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _dist_row(name: str, dist: Distribution) -> list[str]:
    return [name, _ms(dist.mean), _ms(dist.p50), _ms(dist.p90), _ms(dist.p99)]


def _engine_share(s: RunSummary) -> str:
    share = s.server.engine_share(s.duration_s) if s.server is not None else None
    return _num(share * 100, 1) if share is not None else "-"


def throughput_table(summaries: Sequence[RunSummary]) -> Table:
    """One column per run (a sweep reads left to right), one row per figure."""
    table = Table(title="tgictl bench: throughput")
    table.add_column("figure")
    for s in summaries:
        table.add_column(s.label, justify="right")

    def server(name: str, s: RunSummary) -> str:
        value = getattr(s.server, name) if s.server is not None else None
        return _num(value * 100, 1) if value is not None else "-"

    rows: list[tuple[str, Callable[[RunSummary], str]]] = [
        ("requests ok / failed", lambda s: f"{s.succeeded} / {s.failed}"),
        ("duration s", lambda s: _num(s.duration_s)),
        ("requests/s", lambda s: _num(s.requests_per_s)),
        ("output tokens/s", lambda s: _num(s.output_tokens_per_s, 1)),
        ("total tokens/s", lambda s: _num(s.total_tokens_per_s, 1)),
        ("goodput requests/s", lambda s: _num(s.goodput.requests_per_s) if s.goodput else "-"),
        ("goodput % of requests", lambda s: _num(s.goodput.fraction * 100, 1) if s.goodput else "-"),
        ("prefix-cache hit % (tokens)", lambda s: server("prefix_cache_hit_rate", s)),
        ("peak KV use % (running requests)", lambda s: server("kv_peak_active_fraction", s)),
        ("shard forward+sampling % of run", _engine_share),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(s) for s in summaries))
    return table


def latency_table(s: RunSummary) -> Table:
    latency = Table(title=f"{s.label}: latency (ms)")
    for column in ("metric", "mean", "p50", "p90", "p99"):
        latency.add_column(column, justify="right" if column != "metric" else "left")
    for name, dist in (("time to first token", s.ttft), ("inter-token latency, per token", s.itl),
                       ("inter-token latency, per burst", s.itl_burst), ("time per output token", s.tpot),
                       ("end-to-end latency", s.e2e)):
        latency.add_row(*_dist_row(name, dist))
    # Multi-step decode sends several tokens per read: per burst is the wait a reader sees between them,
    # per token that wait divided by the tokens it brought (a gap inside a burst would read as 0 ms).
    latency.caption = "per burst: time between arrivals of tokens; per token: that time / the tokens it brought"
    return latency


def json_safe(value: Any) -> Any:
    """NaN and infinities become null: JSON has no spelling for them."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(path: Path, document: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(json_safe(document), indent=2) + "\n", encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot write --output {str(path)!r}: {err.strerror}") from None
