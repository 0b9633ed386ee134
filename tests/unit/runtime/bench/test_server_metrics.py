"""/metrics deltas: prefix-cache hit rate and KV use from Prometheus text as the router renders it."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tgictl.runtime.bench.server_metrics import parse_samples, server_figures


def _render(hits: float, prompt: float, total: float, free: float, cached: float) -> str:
    """Text with the router's metric names, rendered by prometheus_client as the router does."""
    registry = CollectorRegistry()
    Counter("tgictl_prefix_cache_hit_tokens", "h", registry=registry).inc(hits)
    Counter("tgictl_prompt_tokens", "p", registry=registry).inc(prompt)
    Counter("tgi_request_failure", "f", ["err"], registry=registry).labels(err="validation").inc(2)
    for name, value in (("tgictl_kv_blocks_total", total), ("tgictl_kv_blocks_free", free),
                        ("tgictl_kv_blocks_cached", cached)):
        Gauge(name, name, registry=registry).set(value)
    return generate_latest(registry).decode()


def test_parse_samples_reads_counters_gauges_and_labelled_series() -> None:
    samples = parse_samples(_render(hits=5, prompt=20, total=100, free=60, cached=10))
    assert samples["tgictl_prefix_cache_hit_tokens_total"] == 5.0
    assert samples["tgictl_prompt_tokens_total"] == 20.0
    assert samples["tgictl_kv_blocks_free"] == 60.0
    assert samples["tgi_request_failure_total"] == 2.0


def test_figures_are_deltas_and_peaks() -> None:
    before = parse_samples(_render(hits=100, prompt=400, total=100, free=90, cached=10))
    during = [parse_samples(_render(hits=150, prompt=500, total=100, free=50, cached=20)),  # 30 active
              parse_samples(_render(hits=180, prompt=600, total=100, free=30, cached=25))]  # 45 active
    after = parse_samples(_render(hits=200, prompt=800, total=100, free=70, cached=30))
    figures = server_figures(before, after, during)
    assert figures.prompt_tokens == 400 and figures.prefix_cache_hit_tokens == 100
    assert figures.prefix_cache_hit_rate == pytest.approx(0.25)
    assert figures.kv_blocks_total == 100 and figures.kv_peak_active_blocks == 45
    assert figures.kv_peak_active_fraction == pytest.approx(0.45)
    assert figures.kv_cached_blocks_after == 30


def test_a_server_without_tgictl_series_gives_nothing() -> None:
    foreign = {"vllm:num_requests_running": 3.0}
    figures = server_figures(foreign, foreign, [])
    assert figures.prefix_cache_hit_rate is None and figures.kv_peak_active_fraction is None
    assert figures.prompt_tokens is None and figures.kv_blocks_total is None


def _render_steps(forward: dict[str, float], rpc: dict[str, float]) -> str:
    """The router's two step histograms (labelled by method) with the given sums."""
    registry = CollectorRegistry()
    forward_h = Histogram("tgi_batch_forward_duration", "f", ["method"], registry=registry)
    rpc_h = Histogram("tgi_batch_inference_duration", "i", ["method"], registry=registry)
    for method, value in forward.items():
        forward_h.labels(method=method).observe(value)
    for method, value in rpc.items():
        rpc_h.labels(method=method).observe(value)
    return generate_latest(registry).decode()


def test_engine_share_is_the_shard_time_over_the_run() -> None:
    before = parse_samples(_render_steps({"prefill": 1.0, "decode": 2.0}, {"prefill": 1.5, "decode": 2.5}))
    after = parse_samples(_render_steps({"prefill": 2.0, "decode": 6.0}, {"prefill": 3.0, "decode": 7.0}))
    figures = server_figures(before, after, [])
    assert figures.shard_forward_s == pytest.approx(5.0)  # prefill and decode steps: 8 - 3
    assert figures.shard_rpc_s == pytest.approx(6.0)  # 10 - 4
    assert figures.engine_share(10.0) == pytest.approx(0.5)
    assert server_figures({}, {}, []).engine_share(10.0) is None
