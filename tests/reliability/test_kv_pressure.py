"""KV pressure: a KV cache of 32 blocks of 16 tokens (--kv-cache-memory 256KiB on the tiny
llama, 8 KiB a block) and eight concurrent requests of ~250 tokens (16 blocks each): at most two fit
at a time, so the others wait in the queue. All must finish with the output they get alone, with no
out-of-memory and no error; a request that could never fit is refused with 422 at validation."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from tests.integration.http_stack import Stack
from tests.reliability.support import (
    GREEDY,
    assert_error_json,
    generate,
    kv_state,
    wait_idle,
)

REQUESTS = 8
NEW_TOKENS = 150
MAX_TOTAL = 256


@pytest.fixture(scope="module")
def stack_args() -> tuple[list[str], list[str]]:
    router = ["--max-total-tokens", str(MAX_TOTAL), "--max-batch-prefill-tokens", "256"]
    return router, ["--kv-cache-memory", "256KiB"]


def prompt(index: int) -> str:
    # Distinct from the first word on: no prefix-cache sharing relieves the pressure.
    return " ".join(f"w{index}x{k}" for k in range(22))  # ~100 tokens


async def run_all(url: str) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as http:
        return list(
            await asyncio.gather(
                *(
                    http.post(
                        "/generate",
                        json={"inputs": prompt(i), "parameters": {**GREEDY, "max_new_tokens": NEW_TOKENS}},
                    )
                    for i in range(REQUESTS)
                )
            )
        )


def test_requests_beyond_the_kv_cache_wait_and_all_finish(stack: Stack) -> None:
    idle = kv_state(stack.url)
    assert idle.total <= 32, f"the KV cache is larger than this test assumes: {idle}"
    reference = [generate(stack.url, prompt(i), NEW_TOKENS) for i in range(REQUESTS)]

    peak = {"queue": 0, "min_free": idle.total}
    stop = threading.Event()

    def watch() -> None:  # the queue must really have filled: the pressure was real
        while not stop.is_set():
            state = kv_state(stack.url)
            peak["queue"] = max(peak["queue"], state.queue)
            peak["min_free"] = min(peak["min_free"], state.free + state.cached)
            stop.wait(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        responses = asyncio.run(asyncio.wait_for(run_all(stack.url), timeout=240))
    finally:
        stop.set()
        watcher.join(timeout=10)

    assert [r.status_code for r in responses] == [200] * REQUESTS, [r.text[:200] for r in responses]
    texts = [r.json()["generated_text"] for r in responses]
    assert texts == reference
    assert peak["queue"] >= REQUESTS - 3, f"requests did not have to wait: {peak}"
    assert stack.shard.poll() is None, "the shard died (out of memory?)"
    state = wait_idle(stack.url)
    assert state.free + state.cached == state.total
    print(f"\nkv pressure: {REQUESTS} concurrent requests of ~250 tokens on {idle.total} blocks of 16; "
          f"all {REQUESTS} finished with their output alone; peak queue {peak['queue']}, "
          f"fewest free blocks {peak['min_free']}; blocks leaked: {state.total - state.free - state.cached}")


def test_a_request_that_can_never_fit_is_422_at_validation(stack: Stack) -> None:
    for body in (
        {"inputs": prompt(0), "parameters": {"max_new_tokens": MAX_TOTAL}},
        {"inputs": prompt(0) * 6, "parameters": {"max_new_tokens": 1}},  # the prompt alone is too long
    ):
        answer = httpx.post(f"{stack.url}/generate", json=body, timeout=30)
        assert answer.status_code == 422, answer.text
        error = assert_error_json(422, answer.content)
        assert error["error_type"] == "validation"
        assert f"`inputs` tokens + `max_new_tokens` must be <= {MAX_TOTAL}" in error["error"], error
    assert kv_state(stack.url).queue == 0  # refused before it was queued
