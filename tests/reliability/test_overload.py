"""Overload: three times --max-concurrent-requests at once. The excess is refused with
429 and TGI's error JSON at once (while the admitted requests are still running), and every admitted
request finishes with its full output."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import httpx
import pytest

from tests.integration.http_stack import Stack
from tests.reliability.support import (
    GREEDY,
    assert_error_json,
    is_error_event,
    sse_data,
    wait_idle,
)

MAX_CONCURRENT = 4
NEW_TOKENS = 400  # ~1-2 s of decoding for the four admitted requests: all twelve arrive meanwhile
ROUTES = ("/generate", "/generate_stream", "/v1/completions")


@pytest.fixture(scope="module")
def stack_args() -> tuple[list[str], list[str]]:
    return ["--max-concurrent-requests", str(MAX_CONCURRENT)], []


@dataclass(frozen=True)
class Answer:
    route: str
    status: int
    seconds: float
    tokens: int | None  # generated tokens of a finished request
    error_type: str | None


def request_body(route: str, index: int, new_tokens: int) -> dict[str, object]:
    text = f"overload client {index} says hello"
    if route == "/v1/completions":
        return {"prompt": text, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    return {"inputs": text, "parameters": {**GREEDY, "max_new_tokens": new_tokens, "details": True}}


async def one(http: httpx.AsyncClient, route: str, index: int, new_tokens: int = NEW_TOKENS) -> Answer:
    start = time.monotonic()
    response = await http.post(route, json=request_body(route, index, new_tokens))
    seconds = time.monotonic() - start
    if response.status_code != 200:
        error = assert_error_json(response.status_code, response.content)
        return Answer(route, response.status_code, seconds, None, error["error_type"])
    if route == "/generate_stream":
        events = sse_data(response.text.splitlines())
        if any(is_error_event(e) for e in events):
            return Answer(route, 200, seconds, None, str(events[-1]))
        return Answer(route, 200, seconds, events[-1]["details"]["generated_tokens"], None)
    payload = response.json()
    if route == "/v1/completions":
        return Answer(route, 200, seconds, payload["usage"]["completion_tokens"], None)
    tokens = payload["details"]["generated_tokens"]
    return Answer(route, 200, seconds, tokens, None)


async def burst(url: str) -> list[Answer]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as http:
        return list(await asyncio.gather(*(one(http, ROUTES[i % len(ROUTES)], i) for i in range(3 * MAX_CONCURRENT))))


def test_excess_gets_429_at_once_and_admitted_requests_finish(stack: Stack) -> None:
    answers = asyncio.run(asyncio.wait_for(burst(stack.url), timeout=180))
    admitted = [a for a in answers if a.status == 200]
    refused = [a for a in answers if a.status == 429]
    assert len(admitted) == MAX_CONCURRENT and len(refused) == 2 * MAX_CONCURRENT, answers
    assert all(a.error_type == "overloaded" for a in refused), refused
    assert all(a.tokens == NEW_TOKENS for a in admitted), admitted
    # "At once": every refusal came back before the fastest admitted request finished.
    assert max(a.seconds for a in refused) < min(a.seconds for a in admitted), answers
    state = wait_idle(stack.url)
    assert state.free + state.cached == state.total
    print(f"\noverload: {len(answers)} requests at once; {len(admitted)} admitted, all finished "
          f"({dict(Counter(a.route for a in admitted))}); {len(refused)} got 429 within "
          f"{max(a.seconds for a in refused) * 1000:.0f} ms "
          f"(admitted took >= {min(a.seconds for a in admitted):.1f} s); "
          f"blocks leaked: {state.total - state.free - state.cached}")


def test_permits_come_back_after_overload(stack: Stack) -> None:
    """Once the burst is over, all MAX_CONCURRENT permits are free again."""
    answers = asyncio.run(asyncio.wait_for(burst_of(stack.url, MAX_CONCURRENT), timeout=120))
    assert [(a.status, a.tokens) for a in answers] == [(200, 8)] * MAX_CONCURRENT


async def burst_of(url: str, count: int) -> list[Answer]:
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as http:
        return list(await asyncio.gather(*(one(http, "/generate", i, new_tokens=8) for i in range(count))))
