"""The gauges Gateway API Inference Extension and llm-d scrape, under vLLM's names, read live from a
router's queue, batcher and allocator."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path

from tests.unit.runtime.router.test_service import run
from tgictl.testing.fake_shard import FakeServiceClient, fake_info
from tgictl.proto.messages import SamplingParams
from tgictl.runtime.router.gateway_metrics import kv_usage_fraction
from tgictl.runtime.router.request import ValidatedRequest
from tgictl.runtime.router.scheduling.entry import Entry
from tgictl.runtime.router.service import RouterService


def sample(service: RouterService, name: str) -> tuple[str, float]:
    text = service.metrics.render().decode()
    match = re.search(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    assert match is not None, name
    assert f"# TYPE {name} gauge" in text
    return match.group(1) or "", float(match.group(2))


def test_gateway_gauges_follow_the_queue_the_batch_and_the_allocator(tiny_tokenizer_dir: Path) -> None:
    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                     "vllm:gpu_cache_usage_perc"):
            assert sample(service, name)[1] == 0.0
        labels, _ = sample(service, "vllm:lora_requests_info")
        assert labels == '{max_lora="0",running_lora_adapters="",waiting_lora_adapters=""}'
        labels, value = sample(service, "vllm:cache_config_info")
        assert value == 1.0 and labels == f'{{block_size="16",num_gpu_blocks="{service.allocator.total_blocks}"}}'

        # Queued without waking the batcher: waiting, not running.
        request = ValidatedRequest(input_ids=(1, 2, 3), sampling=SamplingParams(), max_new_tokens=4)
        service.queue.append(Entry(request, lambda e: None, lambda: False))
        assert sample(service, "vllm:num_requests_waiting")[1] == 1.0
        assert sample(service, "vllm:num_requests_running")[1] == 0.0

        allocation = service.allocator.allocate(16 * 10, None)
        assert allocation is not None
        expected = 10 / service.allocator.total_blocks
        assert sample(service, "vllm:kv_cache_usage_perc")[1] == expected
        assert sample(service, "vllm:gpu_cache_usage_perc")[1] == expected
        service.allocator.free(allocation, None)
        assert sample(service, "vllm:kv_cache_usage_perc")[1] == 0.0

    run(tiny_tokenizer_dir, body)


def test_kv_usage_fraction() -> None:
    assert kv_usage_fraction(5, 20) == 0.25
    assert kv_usage_fraction(0, 0) == 0.0


def test_lora_info_names_the_adapters_of_queued_and_running_requests(tiny_tokenizer_dir: Path) -> None:
    """The endpoint picker's LoRA affinity reads these labels: loaded count, then who waits and runs."""
    fake = FakeServiceClient(info_reply=dataclasses.replace(fake_info(), adapters=("sql", "chat", "code")),
                             step_delay_s=0.2)

    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        labels, first_value = sample(service, "vllm:lora_requests_info")
        assert labels == '{max_lora="3",running_lora_adapters="",waiting_lora_adapters=""}'
        assert sample(service, "vllm:lora_requests_info")[1] == first_value  # unchanged labels, same time

        def request(adapter: str | None, index: int) -> Entry:
            validated = ValidatedRequest(input_ids=(1, 2, 3), sampling=SamplingParams(), max_new_tokens=50,
                                         adapter_index=index, adapter=adapter)
            return Entry(validated, lambda e: None, lambda: False)

        for adapter, index in (("sql", 1), ("chat", 2), (None, 0), ("sql", 1)):
            service.queue.append(request(adapter, index))  # queued, the batcher not woken
        labels, value = sample(service, "vllm:lora_requests_info")
        assert labels == '{max_lora="3",running_lora_adapters="",waiting_lora_adapters="chat,sql"}'
        assert value >= first_value

        service.batcher.notify()  # admits them; the slow fake shard keeps them running
        for _ in range(100):
            if service.batcher.in_flight == 4:
                break
            await asyncio.sleep(0.01)
        labels, _ = sample(service, "vllm:lora_requests_info")
        assert labels == '{max_lora="3",running_lora_adapters="chat,sql",waiting_lora_adapters=""}'

    run(tiny_tokenizer_dir, body, fake=fake)
