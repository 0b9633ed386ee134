"""The gauges that replica-aware routers read, under vLLM's names: Kubernetes' Gateway API Inference
Extension (its endpoint picker's "model server protocol") and llm-d scrape these from every replica to
pick one, so tgictl replicas can sit behind that scheduler as vLLM's do.

| name | type | what tgictl reports |
| --- | --- | --- |
| `vllm:num_requests_waiting` | gauge | requests in the router's queue (TotalQueuedRequests) |
| `vllm:num_requests_running` | gauge | requests in the running batch (TotalRunningRequests) |
| `vllm:kv_cache_usage_perc` | gauge | KV blocks pinned by live requests / usable blocks, a fraction 0..1 (KVCacheUtilization); blocks only the prefix cache holds are evictable, so they count as free, as in vLLM |
| `vllm:gpu_cache_usage_perc` | gauge | the same figure under the name older endpoint pickers scrape |
| `vllm:lora_requests_info` | gauge | value: when the labels last changed (Unix s); labels `max_lora` (adapters loaded: every one can be in a batch), `running_lora_adapters` and `waiting_lora_adapters` (the adapters of running and of queued requests, comma-separated; the endpoint picker's LoRA affinity reads them) |
| `vllm:cache_config_info` | gauge | value 1; labels `block_size`, `num_gpu_blocks` (the optional BlockSize of the protocol) |

Read at scrape time from the live objects (docs/architecture.md, "Memory model"), like the other gauges.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


@dataclass(frozen=True)
class GatewaySources:
    """Where each gauge reads its value."""

    waiting: Callable[[], float]
    running: Callable[[], float]
    kv_usage: Callable[[], float]  # a fraction 0..1
    block_size: int
    num_blocks: int
    max_lora: Callable[[], int] = lambda: 0  # adapters loaded (they change with /v1/load_lora_adapter)
    running_adapters: Callable[[], Iterable[str | None]] = tuple  # each running request's (None: base)
    waiting_adapters: Callable[[], Iterable[str | None]] = tuple  # each queued request's


def kv_usage_fraction(used_blocks: int, total_blocks: int) -> float:
    return used_blocks / total_blocks if total_blocks > 0 else 0.0


def register_gateway_gauges(registry: CollectorRegistry, sources: GatewaySources) -> None:
    Gauge("vllm:num_requests_waiting", "Requests waiting in the queue", registry=registry).set_function(
        sources.waiting
    )
    Gauge("vllm:num_requests_running", "Requests in the running batch", registry=registry).set_function(
        sources.running
    )
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        Gauge(name, "KV-cache usage: blocks held by live requests / usable blocks (0..1)",
              registry=registry).set_function(sources.kv_usage)
    registry.register(_LoraRequestsInfo(sources))
    cache = Gauge("vllm:cache_config_info", "KV cache configuration", ["block_size", "num_gpu_blocks"],
                  registry=registry)
    cache.labels(block_size=str(sources.block_size), num_gpu_blocks=str(sources.num_blocks)).set(1)


def _names(adapters: Iterable[str | None]) -> str:
    return ",".join(sorted({name for name in adapters if name is not None}))


class _LoraRequestsInfo(Collector):
    """vLLM's one-sample gauge whose labels carry the adapter sets, read at scrape time; its value is
    when they last changed (vLLM sets it at every change)."""

    def __init__(self, sources: GatewaySources) -> None:
        self._sources = sources
        self._labels: tuple[str, str, str] | None = None
        self._since = time.time()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = (str(self._sources.max_lora()), _names(self._sources.running_adapters()),
                  _names(self._sources.waiting_adapters()))
        if labels != self._labels:
            self._labels, self._since = labels, time.time()
        family = GaugeMetricFamily("vllm:lora_requests_info", "LoRA adapters: value is when the labels last "
                                   "changed (Unix s)", labels=["max_lora", "running_lora_adapters",
                                                               "waiting_lora_adapters"])
        family.add_metric(list(labels), self._since)
        yield family
