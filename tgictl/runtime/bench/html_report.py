"""`tgictl bench --report FILE.html`: one self-contained page (inline SVG and CSS, no script, no
network) with throughput and latency percentiles against the load level, the TTFT and inter-token
latency distribution of every run, the run's settings and what the server said about itself (/info).
Built from the same document `--output` writes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from tgictl.errors import ConfigError
from tgictl.runtime.bench.svg_charts import Series, histogram, line_chart

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
svg.chart { background: #fafafa; border: 1px solid #e4e4e4; font-size: 11px; }
svg.chart .title { font-size: 13px; font-weight: 600; }
svg.chart .axis { stroke: #555; } svg.chart .grid { stroke: #e6e6e6; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; } td:first-child, th:first-child { text-align: left; }
"""


def _load_axis(runs: Sequence[Mapping[str, Any]]) -> tuple[str, list[float]]:
    plans = [run["plan"] for run in runs]
    if all(p.get("concurrency") is not None for p in plans):
        return "concurrency (clients)", [float(p["concurrency"]) for p in plans]
    if all(p.get("request_rate") is not None for p in plans):
        return "request rate (requests/s)", [float(p["request_rate"]) for p in plans]
    return "run", [float(i + 1) for i in range(len(runs))]


def _ms(value: Any) -> float | None:
    return None if value is None else float(value) * 1000.0


def _percentile_series(runs: Sequence[Mapping[str, Any]], key: str, name: str) -> list[Series]:
    return [Series(f"{name} {p}", tuple(_ms(run["summary"][key].get(p)) for run in runs)) for p in ("p50", "p90", "p99")]


def _table(rows: Sequence[tuple[str, Any]], header: tuple[str, str] = ("setting", "value")) -> str:
    cells = "".join(f"<tr><td>{escape(str(k))}</td><td>{escape(_text(v))}</td></tr>" for k, v in rows)
    return f"<table><tr><th>{escape(header[0])}</th><th>{escape(header[1])}</th></tr>{cells}</table>"


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return "-" if value is None else str(value)


def _summary_table(runs: Sequence[Mapping[str, Any]]) -> str:
    figures = (("requests ok", "succeeded"), ("failed", "failed"), ("requests/s", "requests_per_s"),
               ("output tokens/s", "output_tokens_per_s"), ("total tokens/s", "total_tokens_per_s"))
    head = "".join(f"<th>{escape(run['summary']['label'])}</th>" for run in runs)
    body = "".join(
        f"<tr><td>{escape(name)}</td>" + "".join(f"<td>{escape(_text(run['summary'][key]))}</td>" for run in runs)
        + "</tr>" for name, key in figures
    )
    for metric, key in (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("TPOT", "tpot_s"), ("end-to-end", "e2e_s")):
        for p in ("p50", "p99"):
            body += f"<tr><td>{metric} {p} ms</td>" + "".join(
                f"<td>{escape(_text(_ms(run['summary'][key].get(p))))}</td>" for run in runs) + "</tr>"
    return f"<table><tr><th>figure</th>{head}</tr>{body}</table>"


def render_report(document: Mapping[str, Any]) -> str:
    """The page for an HTTP bench document (mode "http")."""
    runs = document["runs"]
    axis, xs = _load_axis(runs)
    throughput = line_chart("Throughput", axis, "tokens/s", xs, [
        Series("output tokens/s", tuple(run["summary"]["output_tokens_per_s"] for run in runs)),
        Series("total tokens/s", tuple(run["summary"]["total_tokens_per_s"] for run in runs)),
    ])
    requests = line_chart("Requests per second", axis, "requests/s", xs, [
        Series("requests/s", tuple(run["summary"]["requests_per_s"] for run in runs)),
    ])
    latency = [line_chart(f"{title} percentiles", axis, "ms", xs, _percentile_series(runs, key, short))
               for title, key, short in (("Time to first token", "ttft_s", "TTFT"),
                                         ("Inter-token latency", "itl_s", "ITL"),
                                         ("End-to-end latency", "e2e_s", "E2E"))]
    distributions = []
    for run in runs:
        ok = [r for r in run["requests"] if r.get("error") is None]
        label = run["summary"]["label"]
        distributions.append(histogram(f"{label}: time to first token", "ms",
                                       [r["ttft_s"] * 1000 for r in ok if r.get("ttft_s") is not None]))
        distributions.append(histogram(f"{label}: inter-token latency", "ms",
                                       [gap * 1000 for r in ok for gap in r.get("itl_s", [])]))
    config = document.get("config", {})
    info = document.get("server_info")
    info_html = _table(sorted(info.items()), ("field", "value")) if isinstance(info, dict) else \
        "<p>The server answered no /info.</p>"
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>tgictl bench: {escape(str(config.get('url', '')))}</title><style>{_STYLE}</style></head><body>"
        f"<h1>tgictl bench {escape(str(document.get('tgictl_version', '')))}: {escape(str(config.get('url', '')))}"
        f" ({escape(str(config.get('api', '')))})</h1>"
        f"<h2>Throughput</h2><div class=\"charts\">{throughput}{requests}</div>"
        f"<h2>Latency percentiles</h2><div class=\"charts\">{''.join(latency)}</div>"
        f"<h2>Distributions per run</h2><div class=\"charts\">{''.join(distributions)}</div>"
        f"<h2>Figures</h2>{_summary_table(runs)}"
        f"<h2>Settings</h2>{_table(sorted(config.items()))}"
        f"<h2>Server /info</h2>{info_html}"
        "</body></html>\n"
    )


def write_report(path: Path, document: Mapping[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_report(document), encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot write --report {str(path)!r}: {err.strerror}") from None
