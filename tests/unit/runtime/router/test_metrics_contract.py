"""/metrics against llm-d's metric contract: the Gateway API Inference Extension's "Model Server Protocol"
(tests/data/llm_d_model_server_protocol.md, its text as published). The test reads the contract's table
and LoRA section for the names, types and labels, and checks a live router's /metrics (HTTP, in process,
over a slow fake shard with requests waiting and running) against them, values in their ranges: request
counts whole and >= 0, KV utilization a fraction (vLLM's and llm-d's reading of "percentage"), block
facts positive integers, the LoRA gauge a Unix time with comma-separated adapter names."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.runtime.router.test_service import run
from tgictl.proto.messages import SamplingParams
from tgictl.runtime.router.http.app import create_app
from tgictl.runtime.router.request import ValidatedRequest
from tgictl.runtime.router.scheduling.entry import Entry
from tgictl.runtime.router.service import RouterService
from tgictl.testing.fake_shard import FakeServiceClient, fake_info

CONTRACT = Path(__file__).resolve().parents[4] / "tests" / "data" / "llm_d_model_server_protocol.md"


@dataclasses.dataclass(frozen=True)
class Required:
    role: str  # the contract's name for it
    kind: str  # "gauge" or "labeled"
    name: str  # the vLLM metric
    label: str | None = None


def contract() -> list[Required]:
    text = CONTRACT.read_text()
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("Metric", "-----"):
            continue
        role, kind, _, vllm = cells
        if kind == "Gauge":
            (name,) = re.findall(r"`([^`]+)`", vllm)
            rows.append(Required(role, "gauge", name))
        elif kind == "Labeled":
            name, label = re.findall(r"`([^`]+)`", vllm)
            rows.append(Required(role, "labeled", name, label))
    lora = text[text.index("### LoRA Adapter Serving"):]
    (lora_name,) = re.findall(r"Metric name implemented in vLLM: `([^`]+)`", lora)
    assert re.search(r"Metric type: Gauge", lora)
    for label in re.findall(r"^\s*\* `([a-z_]+)`:", lora, re.MULTILINE):
        rows.append(Required("LoRA", "lora", lora_name, label))
    return rows


def test_the_contract_text_is_what_the_test_reads() -> None:
    rows = contract()
    assert {r.role for r in rows} == {"TotalQueuedRequests", "TotalRunningRequests", "KVCacheUtilization",
                                      "[Optional] BlockSize", "[Optional] NumGPUBlocks", "LoRA"}
    assert [r.label for r in rows if r.kind == "lora"] == ["max_lora", "running_lora_adapters", "waiting_lora_adapters"]


def test_metrics_conform_to_the_contract_while_requests_wait_and_run(tiny_tokenizer_dir: Path) -> None:
    fake = FakeServiceClient(info_reply=dataclasses.replace(fake_info(), adapters=("sql", "chat")), step_delay_s=0.2)

    async def scrape(service: RouterService) -> dict[str, object]:
        transport = httpx.ASGITransport(app=create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            response = await client.get("/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        return {family.name: family for family in text_string_to_metric_families(response.text)}

    def check(families: dict[str, object], waiting: int, running: int) -> None:
        for required in contract():
            family = families.get(required.name)
            assert family is not None, f"{required.role}: {required.name} missing"
            samples = family.samples  # type: ignore[attr-defined]
            assert family.type == "gauge", (required.name, family.type)  # type: ignore[attr-defined]
            assert len(samples) == 1, (required.name, samples)
            (sample,) = samples
            if required.kind == "gauge":
                assert sample.labels == {}
                if required.role == "KVCacheUtilization":
                    assert 0.0 <= sample.value <= 1.0
                else:
                    assert sample.value == int(sample.value) >= 0
                    assert sample.value == {"TotalQueuedRequests": waiting, "TotalRunningRequests": running}[required.role]
            elif required.kind == "labeled":
                assert sample.labels[required.label].isdigit() and int(sample.labels[required.label]) > 0
            else:
                value = sample.labels[required.label]
                if required.label == "max_lora":
                    assert value == "2"
                else:
                    assert value == "" or all(name in ("sql", "chat") for name in value.split(","))
                assert 0 < sample.value <= time.time()  # when the labels last changed

    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        check(await scrape(service), waiting=0, running=0)
        for adapter, index in (("sql", 1), ("chat", 2), (None, 0)):
            request = ValidatedRequest(input_ids=tuple(range(1, 40)), sampling=SamplingParams(), max_new_tokens=50,
                                       adapter_index=index, adapter=adapter)
            service.queue.append(Entry(request, lambda e: None, lambda: False))
        families = await scrape(service)
        check(families, waiting=3, running=0)
        assert families["vllm:lora_requests_info"].samples[0].labels["waiting_lora_adapters"] == "chat,sql"  # type: ignore[attr-defined]
        service.batcher.notify()
        for _ in range(200):
            if service.batcher.in_flight == 3:
                break
            await asyncio.sleep(0.01)
        families = await scrape(service)
        check(families, waiting=0, running=3)
        assert families["vllm:kv_cache_usage_perc"].samples[0].value > 0  # type: ignore[attr-defined]

    run(tiny_tokenizer_dir, body, fake=fake)
