"""Metrics: one registry per router, TGI's names, and the batch figures MeteredClient records."""

from __future__ import annotations

import asyncio
import re

import pytest
from prometheus_client import REGISTRY

from tgictl.testing.fake_shard import FakeServiceClient
from tgictl.errors import GenerationError
from tgictl.proto.messages import Batch, Request, SamplingParams, StoppingParams
from tgictl.runtime.router.metered_client import MeteredClient
from tgictl.runtime.router.metrics import (
    RouterMetrics,
    duration_buckets,
    linear_buckets,
)


def value(metrics: RouterMetrics, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", metrics.render().decode(), re.MULTILINE)
    assert match is not None, sample
    return float(match.group(1))


def test_each_router_has_its_own_registry() -> None:
    a = RouterMetrics(max_input_tokens=100, max_total_tokens=200)
    b = RouterMetrics(max_input_tokens=100, max_total_tokens=200)  # no "duplicated timeseries" error
    a.request_count.inc()
    assert value(a, "tgi_request_count_total") == 1.0
    assert value(b, "tgi_request_count_total") == 0.0
    assert "tgi_request_count_total" not in {m.name for m in REGISTRY.collect()}


def test_tgi_names_and_zeroed_labels() -> None:
    metrics = RouterMetrics(max_input_tokens=100, max_total_tokens=200)
    text = metrics.render().decode()
    for name in ("tgi_request_count", "tgi_request_success", "tgi_request_failure", "tgi_request_duration",
                 "tgi_request_validation_duration", "tgi_request_queue_duration", "tgi_request_inference_duration",
                 "tgi_request_mean_time_per_token_duration", "tgi_request_generated_tokens",
                 "tgi_request_input_length", "tgi_request_max_new_tokens", "tgi_batch_inference_count",
                 "tgi_batch_inference_success", "tgi_batch_inference_failure", "tgi_queue_size",
                 "tgi_batch_current_size", "tgi_batch_current_max_tokens", "tgi_batch_max_total_tokens",
                 "tgi_batch_next_size", "tgi_batch_inference_duration", "tgi_batch_forward_duration",
                 "tgi_batch_decode_duration", "tgi_batch_filter_duration", "tgictl_kv_blocks_total",
                 "tgictl_kv_blocks_free", "tgictl_kv_blocks_cached", "tgictl_prefix_cache_hit_tokens",
                 "tgictl_prompt_tokens"):
        assert f"# TYPE {name}" in text, name
    for err in ("validation", "overloaded", "generation", "incomplete", "dropped", "template"):
        assert value(metrics, f'tgi_request_failure_total{{err="{err}"}}') == 0.0


def test_buckets_follow_tgi() -> None:
    buckets = duration_buckets()
    assert len(buckets) == 35 and buckets[0] == 0.00015
    assert buckets[1] / buckets[0] == 1.5
    assert linear_buckets(200)[:3] == [2.0, 4.0, 6.0] and len(linear_buckets(200)) == 100


def test_gauges_read_live_values() -> None:
    metrics = RouterMetrics(max_input_tokens=100, max_total_tokens=200)
    state = {"free": 5}
    metrics.watch(queue_size=lambda: 3, kv_total=lambda: 10, kv_free=lambda: state["free"], kv_cached=lambda: 2)
    assert value(metrics, "tgictl_kv_blocks_free") == 5.0
    state["free"] = 4
    assert value(metrics, "tgictl_kv_blocks_free") == 4.0
    assert value(metrics, "tgi_queue_size") == 3.0


def test_preemptions_and_waiting_requests_by_priority_are_read_at_scrape_time() -> None:
    metrics = RouterMetrics(max_input_tokens=100, max_total_tokens=200)
    state: dict[str, object] = {"preempted": 0, "waiting": [5, -1, 5, 0]}
    metrics.watch(queue_size=lambda: 4, kv_total=lambda: 10, kv_free=lambda: 1, kv_cached=lambda: 0,
                  preemptions=lambda: state["preempted"], waiting_priorities=lambda: state["waiting"])  # type: ignore[arg-type,return-value]
    assert value(metrics, "tgictl_request_preemptions_total") == 0.0
    assert value(metrics, 'tgictl_queue_size_by_priority{priority="5"}') == 2.0
    assert value(metrics, 'tgictl_queue_size_by_priority{priority="-1"}') == 1.0
    state["preempted"], state["waiting"] = 3, [0]
    assert value(metrics, "tgictl_request_preemptions_total") == 3.0
    assert value(metrics, 'tgictl_queue_size_by_priority{priority="0"}') == 1.0
    assert 'priority="5"' not in metrics.render().decode()  # nobody waits at 5 any more: its series is gone


def _request(rid: int, prompt: int, cache_len: int) -> Request:
    return Request(id=rid, input_ids=tuple(range(10, 10 + prompt)), sampling=SamplingParams(),
                   stopping=StoppingParams(max_new_tokens=2), blocks=(1, 2),
                   cache_len=cache_len)


def test_metered_client_counts_steps_and_prompt_tokens() -> None:
    async def scenario() -> RouterMetrics:
        metrics = RouterMetrics(max_input_tokens=100, max_total_tokens=200)
        fake = FakeServiceClient()
        client = MeteredClient(fake, metrics)
        result = await client.prefill(Batch(id=0, requests=(_request(0, 8, 0), _request(1, 5, 4))), None)
        assert result.batch is not None
        await client.decode([result.batch])  # max_new_tokens=2: both finish here
        fake.shard.fail_next.add("decode")
        with pytest.raises(GenerationError, match="injected decode failure"):
            await client.decode([result.batch])
        return metrics

    metrics = asyncio.run(scenario())
    assert value(metrics, 'tgi_batch_inference_count_total{method="prefill"}') == 1.0
    assert value(metrics, 'tgi_batch_inference_count_total{method="decode"}') == 2.0
    assert value(metrics, 'tgi_batch_inference_success_total{method="decode"}') == 1.0
    assert value(metrics, 'tgi_batch_inference_failure_total{method="decode"}') == 1.0
    assert value(metrics, "tgictl_prompt_tokens_total") == 13.0
    assert value(metrics, "tgictl_prefix_cache_hit_tokens_total") == 4.0
    assert value(metrics, "tgi_batch_next_size_count") == 1.0
    assert value(metrics, "tgi_batch_current_size") == 0.0  # everything finished
