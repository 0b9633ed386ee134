"""Small inline SVG charts for the bench's HTML report: line charts (a figure against the load level)
and histograms (a latency distribution). Pure string building: no plotting library, no script, no
external resource, so the page is one self-contained file."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 560, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 36, 44
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


@dataclass(frozen=True)
class Series:
    name: str
    values: tuple[float | None, ...]  # one per x; None: no value (a run without successes)


def _ticks(low: float, high: float, count: int = 5, whole: bool = False) -> list[float]:
    """Round tick values covering [low, high] (`whole`: steps of at least 1, for counts)."""
    if high <= low:
        high = low + 1.0
    raw = max((high - low) / count, 1.0) if whole else (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= step * factor:
            step *= factor
            break
    first = math.floor(low / step) * step
    return [first + i * step for i in range(int(math.ceil((high - first) / step)) + 1)]


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _frame(title: str, x_label: str, y_label: str, body: list[str], x_ticks: list[tuple[float, str]],
           y_ticks: list[tuple[float, str]]) -> str:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" class="title">{escape(title)}</text>',
        f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" y2="{HEIGHT - BOTTOM}" class="axis"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" class="axis"/>',
    ]
    for px, text in x_ticks:
        parts.append(f'<text x="{px:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{escape(text)}</text>')
    for py, text in y_ticks:
        parts.append(f'<line x1="{LEFT}" y1="{py:.1f}" x2="{WIDTH - RIGHT}" y2="{py:.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{escape(text)}</text>')
    parts.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle">{escape(x_label)}</text>')
    parts.append(f'<text x="14" y="{HEIGHT / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {HEIGHT / 2})">{escape(y_label)}</text>')
    parts.extend(body)
    parts.append("</svg>")
    return "".join(parts)


def line_chart(title: str, x_label: str, y_label: str, xs: Sequence[float], series: Sequence[Series]) -> str:
    """Each series against xs (the load levels), with a legend; points at every value."""
    values = [v for s in series for v in s.values if v is not None and math.isfinite(v)]
    y_ticks = _ticks(0.0, max(values) if values else 1.0)
    y_top = y_ticks[-1]
    x_low, x_high = (min(xs), max(xs)) if xs else (0.0, 1.0)
    span = x_high - x_low or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (plot_w / 2 if x_high == x_low else (x - x_low) / span * plot_w)

    def py(y: float) -> float:
        return HEIGHT - BOTTOM - y / y_top * plot_h

    body: list[str] = [f'<rect x="{LEFT + 6}" y="{TOP}" width="130" height="{8 + 16 * len(series)}" '
                       'fill="white" fill-opacity="0.85" stroke="#ddd"/>'] if series else []
    legend: list[str] = []
    for number, s in enumerate(series):
        color = COLORS[number % len(COLORS)]
        points = [(px(x), py(v)) for x, v in zip(xs, s.values) if v is not None and math.isfinite(v)]
        if len(points) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            body.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        body.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"><title>{escape(s.name)}: '
                    f'{_label(v)}</title></circle>'
                    for (x, y), v in zip(points, [v for v in s.values if v is not None and math.isfinite(v)]))
        ly = TOP + 4 + number * 16
        legend.append(f'<rect x="{LEFT + 10}" y="{ly}" width="10" height="10" fill="{color}"/>'
                      f'<text x="{LEFT + 26}" y="{ly + 9}">{escape(s.name)}</text>')
    body = body[1:] + body[:1] + legend  # the legend's box and entries above the lines
    x_ticks = [(px(x), _label(x)) for x in xs]
    return _frame(title, x_label, y_label, body, x_ticks, [(py(t), _label(t)) for t in y_ticks])


def histogram(title: str, x_label: str, values: Sequence[float], bins: int = 30) -> str:
    """How `values` are spread: counts per equal-width bin, with the p50 and p99 marked."""
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return _frame(title, x_label, "requests", [f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" '
                                                  'text-anchor="middle">no data</text>'], [], [])
    low, high = finite[0], finite[-1]
    width = (high - low) / bins or 1.0
    counts = [0] * bins
    for v in finite:
        counts[min(int((v - low) / width), bins - 1)] += 1
    y_ticks = _ticks(0.0, float(max(counts)), whole=True)
    y_top = y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    bar_w = plot_w / bins
    body = []
    for i, count in enumerate(counts):
        h = count / y_top * plot_h
        body.append(f'<rect x="{LEFT + i * bar_w + 0.5:.1f}" y="{HEIGHT - BOTTOM - h:.1f}" '
                    f'width="{max(bar_w - 1, 0.5):.1f}" height="{h:.1f}" fill="{COLORS[0]}">'
                    f'<title>{_label(low + i * width)}-{_label(low + (i + 1) * width)}: {count}</title></rect>')

    def px(x: float) -> float:
        return LEFT + (x - low) / ((high - low) or 1.0) * plot_w

    for q, color in ((0.5, COLORS[2]), (0.99, COLORS[3])):
        value = finite[min(int(q * len(finite)), len(finite) - 1)]
        body.append(f'<line x1="{px(value):.1f}" y1="{TOP}" x2="{px(value):.1f}" y2="{HEIGHT - BOTTOM}" '
                    f'stroke="{color}" stroke-dasharray="4 3"/>'
                    f'<text x="{px(value) - 3:.1f}" y="{TOP + 10 + 12 * (q > 0.9)}" text-anchor="end" '
                    f'fill="{color}">p{int(q * 100)}</text>')
    x_ticks = [(px(low + (high - low) * f), _label(low + (high - low) * f)) for f in (0, 0.25, 0.5, 0.75, 1)]
    return _frame(title, x_label, "count", body, x_ticks, [(HEIGHT - BOTTOM - t / y_top * plot_h, _label(t))
                                                           for t in y_ticks])
