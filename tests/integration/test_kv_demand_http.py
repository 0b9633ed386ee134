"""KV blocks on demand through the whole server (issue 46): a real shard and router on the tiny float32 model,
with a KV budget far smaller than what the requests would reserve up front. Requests are admitted on their
prompts' blocks, grow, run out, get preempted and resume; the clients see only their (unchanged) answers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.http_stack import Stack, http_stack
from tests.integration.test_http_tgi import greedy as greedy_oracle
from tgictl.testing.tiny_models import window_options

# 20 blocks of 16 (19 usable: 304 KV tokens); one request holds at most 200 (input + max_new_tokens).
ROUTER_ARGS = ("--max-batch-total-tokens", "320", "--max-total-tokens", "200", "--max-input-tokens", "100",
               "--max-batch-prefill-tokens", "256")
PROMPTS = [f"Request {i}: " + " ".join(f"word{(i * 7 + j) % 23}" for j in range(4 + i % 5)) for i in range(6)]
NEW_TOKENS = 150  # 6 requests of ~170 tokens each: ~1,000 KV tokens wanted, 304 held


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with http_stack(tiny_model_dir, tmp_path_factory.mktemp("kv-demand"), router_args=ROUTER_ARGS) as running:
        yield running


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


async def generate(http: httpx.AsyncClient, prompt: str) -> str:
    reply = await http.post("/generate", json={"inputs": prompt, "parameters": {
        "max_new_tokens": NEW_TOKENS, "ignore_eos": True, "details": True}}, timeout=300)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["details"]["generated_tokens"] == NEW_TOKENS
    return str(body["generated_text"])


def test_requests_beyond_the_cache_are_preempted_and_answer_as_alone(stack: Stack) -> None:
    """Each answer equals the same request alone (greedy, float32); the cache ran out (preemptions counted on
    /metrics); every one finished; afterwards every block is free or in the prefix cache."""

    async def scenario() -> tuple[list[str], list[str]]:
        async with httpx.AsyncClient(base_url=stack.url) as http:
            alone = [await generate(http, p) for p in PROMPTS]
            together = await asyncio.wait_for(asyncio.gather(*(generate(http, p) for p in PROMPTS)), timeout=600)
            return alone, list(together)

    before = metric(httpx.get(f"{stack.url}/metrics").text, "tgictl_request_preemptions_total")
    alone, together = asyncio.run(scenario())
    assert together == alone
    metrics = httpx.get(f"{stack.url}/metrics").text
    assert metric(metrics, "tgictl_request_preemptions_total") > before
    assert metric(metrics, "tgi_batch_current_size") == 0
    total = metric(metrics, "tgictl_kv_blocks_total")
    assert total == 19
    assert metric(metrics, "tgictl_kv_blocks_free") + metric(metrics, "tgictl_kv_blocks_cached") == total


def test_input_and_max_new_tokens_over_max_total_tokens_is_still_a_422(stack: Stack) -> None:
    """Blocks on demand do not loosen the per-request limit: input + max_new_tokens > --max-total-tokens is
    refused up front, in each API's error shape, and the server keeps serving."""
    tgi = httpx.post(f"{stack.url}/generate", json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 199}})
    assert tgi.status_code == 422 and tgi.json()["error_type"] == "validation"
    assert "200" in tgi.json()["error"]
    with pytest.raises(openai.UnprocessableEntityError):
        stack.openai().completions.create(model="tgi", prompt=PROMPTS[0], max_tokens=199)
    ok = httpx.post(f"{stack.url}/generate", json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 3}})
    assert ok.status_code == 200


def test_a_model_windowed_on_every_layer_holds_only_its_window_and_answers_as_transformers(
    make_tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    """Mistral with a window of 8 on every layer (Info.layer_windows reaches the router): while a prompt generates
    150 tokens (10 or more blocks of 16 without release), /metrics never shows it holding more than 4 blocks;
    its greedy float32 tokens equal transformers'."""
    model_dir = make_tiny_model("mistral", **window_options("mistral", 8))
    prompt = " ".join(f"word{j % 9}" for j in range(12))
    with http_stack(model_dir, tmp_path) as running:
        total = metric(httpx.get(f"{running.url}/metrics").text, "tgictl_kv_blocks_total")
        prompt_ids = [t["id"] for t in httpx.post(f"{running.url}/tokenize", json={"inputs": prompt}).json()]
        assert len(prompt_ids) > 8  # past the window already

        async def scenario() -> tuple[list[int], list[float]]:
            held: list[float] = []
            async with httpx.AsyncClient(base_url=running.url, timeout=300) as http:
                reply = asyncio.create_task(http.post("/generate", json={"inputs": prompt, "parameters": {
                    "max_new_tokens": 150, "ignore_eos": True, "details": True}}))
                while not reply.done():
                    text = (await http.get("/metrics")).text
                    held.append(total - metric(text, "tgictl_kv_blocks_free") - metric(text, "tgictl_kv_blocks_cached"))
                    await asyncio.sleep(0.01)
                body = (await reply).json()
            return [t["id"] for t in body["details"]["tokens"]], held

        generated, held = asyncio.run(scenario())
    assert generated == greedy_oracle(model_dir, prompt_ids, 150)
    assert max(held) > 0 and max(held) <= 4
